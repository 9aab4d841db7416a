//! NATS JetStream helpers: the test server from the environment, streams of
//! the test's own (unique names, deleted on drop), a consumer recording
//! arrival times, and a config for a `nats-hold` strategy.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use hourglass::clock::unix_now_ms;
use hourglass::config::Config;
use tokio::sync::{mpsc, watch};

/// The server under test: `HOURGLASS_TEST_NATS_URL` (scripts/test sets it), else the machine's own.
pub fn nats_url() -> String {
    std::env::var("HOURGLASS_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

pub async fn connect() -> jetstream::Context {
    connect_to(&nats_url()).await
}

pub async fn connect_to(url: &str) -> jetstream::Context {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("NATS at {url}: {e}; start one with JetStream: nats-server -a 127.0.0.1 -p 4222 -js (or run the tests with scripts/test)"));
    jetstream::new(client)
}

/// A stream name and a subject of the test's own.
pub fn unique(stem: &str) -> (String, String) {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..10];
    (format!("e2e-{stem}-{suffix}"), format!("e2e.{stem}.{suffix}"))
}

/// A config on the server under test whose default strategy `hold` holds in a stream of its own.
pub fn hold_config(stem: &str, strategy_table: &str) -> (Config, String) {
    hold_config_on(&nats_url(), stem, strategy_table)
}

/// [`hold_config`] on the server at `url`, with `more` TOML after the strategy.
/// Unless `more` configures `[service.ingress]` or `[service.canary]`, they
/// are off: their default subjects have fixed names, which a test must never
/// use on a shared server.
pub fn hold_config_on(url: &str, stem: &str, strategy_table: &str) -> (Config, String) {
    hold_config_with(url, stem, strategy_table, "")
}

pub fn hold_config_with(url: &str, stem: &str, strategy_table: &str, more: &str) -> (Config, String) {
    let (stream, subject) = unique(&format!("{stem}-hold"));
    let ingress = if more.contains("[service.ingress]") { "" } else { "\n[service.ingress]\nenabled = false\n" };
    let canary = if more.contains("[service.canary]") { "" } else { "\n[service.canary]\nenabled = false\n" };
    let text = format!(
        "default_strategy = \"hold\"\n[broker]\nkind = \"nats\"\nurl = \"{url}\"\n\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"{stream}\"\nsubject = \"{subject}\"\n{strategy_table}\n\n{more}\n{ingress}{canary}"
    );
    (Config::parse(std::path::Path::new("e2e-nats.toml"), text).expect("test config"), stream)
}

pub struct NatsReceived {
    pub body: String,
    pub headers: async_nats::HeaderMap,
    pub at_ms: u64,
    /// When the destination stream stored it (the server's clock), for messages a consumer received.
    pub stored_ms: Option<u64>,
}

impl NatsReceived {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.as_str())
    }
}

/// A stream capturing one subject, consumed in a task that records when each message arrived.
pub struct NatsDestination {
    pub stream: String,
    pub subject: String,
    jetstream: jetstream::Context,
    received: mpsc::UnboundedReceiver<NatsReceived>,
    stop: watch::Sender<bool>,
}

impl NatsDestination {
    pub async fn create(stem: &str) -> NatsDestination {
        Self::create_on(&nats_url(), stem).await
    }

    pub async fn create_on(url: &str, stem: &str) -> NatsDestination {
        let jetstream = connect_to(url).await;
        let (stream, subject) = unique(stem);
        let config = stream::Config { name: stream.clone(), subjects: vec![subject.clone()], ..Default::default() };
        let created = jetstream.create_stream(config).await.unwrap_or_else(|e| panic!("create stream {stream}: {e}"));
        let consumer = created
            .create_consumer(consumer::pull::Config { durable_name: Some("e2e".into()), ack_policy: consumer::AckPolicy::Explicit, ..Default::default() })
            .await
            .expect("destination consumer");
        let (sender, received) = mpsc::unbounded_channel();
        let (stop, mut stopped) = watch::channel(false);
        let mut messages = consumer.messages().await.expect("destination messages");
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    next = messages.next() => next,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                let message = match next {
                    Some(Ok(message)) => message,
                    // A missed heartbeat or a lost connection: the stream pulls again.
                    Some(Err(_)) => continue,
                    None => return,
                };
                let at_ms = unix_now_ms();
                message.ack().await.ok();
                let stored_ms = message.info().ok().map(|info| (info.published.unix_timestamp_nanos() / 1_000_000) as u64);
                let body = String::from_utf8_lossy(&message.payload).into_owned();
                let received = NatsReceived { body, headers: message.headers.clone().unwrap_or_default(), at_ms, stored_ms };
                if sender.send(received).is_err() {
                    return;
                }
            }
        });
        NatsDestination { stream, subject, jetstream, received, stop }
    }

    pub async fn receive(&mut self, count: usize, deadline: Duration) -> Vec<NatsReceived> {
        crate::receive_within(&mut self.received, count, deadline, &self.stream).await
    }

    /// Whatever else arrives within `quiet`.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<NatsReceived> {
        let mut out = Vec::new();
        while let Ok(Some(r)) = tokio::time::timeout(quiet, self.received.recv()).await {
            out.push(r);
        }
        out
    }

    pub async fn delete(self) {
        let _ = self.stop.send(true);
        self.jetstream.delete_stream(&self.stream).await.ok();
    }
}

/// Deletes the streams a held strategy made (the held stream and its parked stream).
pub async fn delete_held(stream: &str) {
    let jetstream = connect().await;
    for name in [stream.to_string(), format!("{stream}-parked")] {
        jetstream.delete_stream(&name).await.ok();
    }
}

/// The messages parked from held stream `stream`, with their reasons.
pub async fn parked(stream: &str) -> Vec<NatsReceived> {
    read_stream(&format!("{stream}-parked")).await
}

/// A nats-server of the version under test (`scripts/nats-server`) that only
/// this test uses, with JetStream on a port and store of its own: one the
/// test may kill and start again. Killed on drop, its store removed.
pub struct PrivateNats {
    pub port: u16,
    store: std::path::PathBuf,
    server: Option<std::process::Child>,
}

impl PrivateNats {
    pub async fn start() -> PrivateNats {
        let port = crate::ports::free_ports(&[0]).expect("a free port for a private nats-server");
        let temp = std::env::temp_dir().canonicalize().expect("the temporary directory");
        let store = temp.join(format!("hourglass-nats-{port}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]));
        std::fs::create_dir_all(&store).expect("the server's store");
        let mut server = PrivateNats { port, store, server: None };
        server.run().await;
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port and store; returns once it takes connections.
    pub async fn run(&mut self) {
        let child = std::process::Command::new(crate::repo_root().join("scripts/nats-server"))
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(self.store.join("jetstream"))
            .arg("-l")
            .arg(self.store.join("log"))
            .spawn()
            .expect("scripts/nats-server starts");
        self.server = Some(child);
        let url = self.url();
        crate::until(&format!("a private nats-server on {url}"), Duration::from_secs(20), async || async_nats::connect(&url).await.is_ok()).await;
    }

    /// `kill -9`, and waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.server.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill9();
        std::fs::remove_dir_all(&self.store).ok();
    }
}

/// Deletes streams by name (those a test's config made hourglass create).
pub async fn delete_streams(names: &[String]) {
    let jetstream = connect().await;
    for name in names {
        jetstream.delete_stream(name).await.ok();
    }
}

/// Every message in stream `name` (read without consuming it), e.g. an invalid-messages stream.
pub async fn read_stream(name: &str) -> Vec<NatsReceived> {
    let jetstream = connect().await;
    let Ok(stream) = jetstream.get_stream(name).await else { return Vec::new() };
    let consumer =
        stream.create_consumer(consumer::pull::Config { ack_policy: consumer::AckPolicy::None, ..Default::default() }).await.expect("a reading consumer");
    let mut batch = consumer.fetch().max_messages(10_000).expires(Duration::from_secs(1)).messages().await.expect("fetch");
    let mut out = Vec::new();
    while let Some(Ok(message)) = batch.next().await {
        out.push(NatsReceived {
            body: String::from_utf8_lossy(&message.payload).into_owned(),
            headers: message.headers.clone().unwrap_or_default(),
            at_ms: unix_now_ms(),
            stored_ms: None,
        });
    }
    out
}
