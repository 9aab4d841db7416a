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

/// A client of the server at `url`, or of any of several comma-separated (a cluster's).
pub async fn connect_to(url: &str) -> jetstream::Context {
    let servers: Vec<&str> = url.split(',').map(str::trim).collect();
    let client = async_nats::connect(servers)
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
    hold_config_replicated(url, 1, stem, strategy_table, more)
}

/// [`hold_config_with`] whose streams hourglass creates with `replicas` (a cluster's).
pub fn hold_config_replicated(url: &str, replicas: usize, stem: &str, strategy_table: &str, more: &str) -> (Config, String) {
    let (stream, subject) = unique(&format!("{stem}-hold"));
    let ingress = if more.contains("[service.ingress]") { "" } else { "\n[service.ingress]\nenabled = false\n" };
    let canary = if more.contains("[service.canary]") { "" } else { "\n[service.canary]\nenabled = false\n" };
    let text = format!(
        "default_strategy = \"hold\"\n[broker]\nkind = \"nats\"\nurl = \"{url}\"\nreplicas = {replicas}\nclock_stream = \"{stream}-clock\"\n\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"{stream}\"\nsubject = \"{subject}\"\n{strategy_table}\n\n{more}\n{ingress}{canary}"
    );
    (Config::parse(std::path::Path::new("e2e-nats.toml"), text).expect("test config"), stream)
}

pub struct NatsReceived {
    pub body: String,
    pub headers: async_nats::HeaderMap,
    pub at_ms: u64,
    /// When the destination stream stored it (the server's clock), for messages a consumer received.
    pub stored_ms: Option<u64>,
    /// Its sequence in the destination stream, for messages a consumer received: a
    /// delivery again of one sequence is the test consumer's, a second sequence of one body the publisher's.
    pub stream_sequence: Option<u64>,
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
    /// Deletes the stream if the test ends without [`Self::delete`] (it failed).
    _cleanup: Cleanup,
}

impl NatsDestination {
    pub async fn create(stem: &str) -> NatsDestination {
        Self::create_on(&nats_url(), stem).await
    }

    pub async fn create_on(url: &str, stem: &str) -> NatsDestination {
        Self::create_replicated(url, stem, 1).await
    }

    /// A destination whose stream (and so its consumer) has `replicas` (a cluster's).
    pub async fn create_replicated(url: &str, stem: &str, replicas: usize) -> NatsDestination {
        let jetstream = connect_to(url).await;
        let (stream, subject) = unique(stem);
        let config = stream::Config { name: stream.clone(), subjects: vec![subject.clone()], num_replicas: replicas, ..Default::default() };
        jetstream.create_stream(config).await.unwrap_or_else(|e| panic!("create stream {stream}: {e}"));
        Self::consume(url, jetstream, stream, subject).await
    }

    /// A destination whose stream allows message schedules (nats-server
    /// 2.12+; older servers ignore the option) and, when `captured`, captures
    /// the subjects hourglass keeps its schedules to it on. Its consumer takes
    /// the destination subject only, not the schedules beside it.
    pub async fn create_for_schedules(stem: &str, captured: bool) -> NatsDestination {
        let url = nats_url();
        let jetstream = connect_to(&url).await;
        let (stream, subject) = unique(stem);
        let mut subjects = vec![subject.clone()];
        if captured {
            subjects.push(format!("hourglass.schedules.*.{subject}"));
        }
        // Raw: the client's typed configuration has the option only with a feature the host leaves off.
        let config = serde_json::json!({ "name": stream, "subjects": subjects, "storage": "file", "allow_msg_schedules": true });
        let created: serde_json::Value = jetstream.request(format!("STREAM.CREATE.{stream}"), &config).await.expect("create stream request");
        assert!(created.get("error").is_none(), "create stream {stream}: {created}");
        Self::consume(&url, jetstream, stream, subject).await
    }

    /// A destination over the stream just made, its consumer taking `subject` only.
    async fn consume(url: &str, jetstream: jetstream::Context, stream: String, subject: String) -> NatsDestination {
        let created = jetstream.get_stream(&stream).await.unwrap_or_else(|e| panic!("stream {stream}: {e}"));
        let consumer = created
            .create_consumer(consumer::pull::Config {
                durable_name: Some("e2e".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                filter_subject: subject.clone(),
                ..Default::default()
            })
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
                let info = message.info().ok();
                let stored_ms = info.as_ref().map(|info| (info.published.unix_timestamp_nanos() / 1_000_000) as u64);
                let stream_sequence = info.as_ref().map(|info| info.stream_sequence);
                let body = String::from_utf8_lossy(&message.payload).into_owned();
                let received = NatsReceived { body, headers: message.headers.clone().unwrap_or_default(), at_ms, stored_ms, stream_sequence };
                if sender.send(received).is_err() {
                    return;
                }
            }
        });
        let cleanup = Cleanup::on(url, std::slice::from_ref(&stream));
        NatsDestination { stream, subject, jetstream, received, stop, _cleanup: cleanup }
    }

    pub async fn receive(&mut self, count: usize, deadline: Duration) -> Vec<NatsReceived> {
        crate::receive_within(&mut self.received, count, deadline, &self.stream).await
    }

    /// The next message, or `None` when none arrives within `wait`.
    pub async fn receive_one(&mut self, wait: Duration) -> Option<NatsReceived> {
        tokio::time::timeout(wait, self.received.recv()).await.ok().flatten()
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

/// Deletes the streams a held strategy made (the held stream and its parked stream) and the clock stream named after it.
pub async fn delete_held(stream: &str) {
    let jetstream = connect().await;
    for name in [stream.to_string(), format!("{stream}-parked"), format!("{stream}-clock")] {
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
            stream_sequence: None,
        });
    }
    out
}

/// Three nats-servers of the version under test (`scripts/nats-server`),
/// clustered with each other with JetStream, on ports and stores of their own:
/// a cluster only this test uses, whose servers it may kill and start again.
/// Every server killed on drop and the stores removed (kept, with the servers'
/// logs, when the test failed).
pub struct PrivateCluster {
    /// The cluster's name; server `i` is `{name}-{i}`.
    pub name: String,
    /// Client ports are `first`, `first + 1`, `first + 2`; route ports the three after.
    first: u16,
    store: std::path::PathBuf,
    servers: Vec<Option<std::process::Child>>,
}

impl PrivateCluster {
    pub const SIZE: u16 = 3;

    /// Starts the three servers; returns once JetStream has a meta leader and
    /// a stream of three replicas can be made (every server a peer of it).
    pub async fn start() -> PrivateCluster {
        let offsets: Vec<u16> = (0..2 * Self::SIZE).collect();
        let first = crate::ports::free_ports(&offsets).expect("free ports for a private nats cluster");
        let temp = std::env::temp_dir().canonicalize().expect("the temporary directory");
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let store = temp.join(format!("hourglass-nats-cluster-{first}-{suffix}"));
        std::fs::create_dir_all(&store).expect("the cluster's store");
        let mut cluster = PrivateCluster { name: format!("hg-{suffix}"), first, store, servers: (0..Self::SIZE).map(|_| None).collect() };
        for i in 0..Self::SIZE as usize {
            cluster.spawn(i);
        }
        for i in 0..Self::SIZE as usize {
            cluster.wait_for_clients(i).await;
        }
        cluster.wait_for_jetstream().await;
        cluster
    }

    /// Server `i`'s client URL.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.first + i as u16)
    }

    /// Every server's client URL, comma-separated: hourglass's `[broker] url` for the cluster.
    pub fn urls(&self) -> String {
        (0..Self::SIZE as usize).map(|i| self.url(i)).collect::<Vec<_>>().join(",")
    }

    /// Server `i`'s name (`--server_name`), as a stream's cluster info names its leader.
    pub fn server_name(&self, i: usize) -> String {
        format!("{}-{i}", self.name)
    }

    /// The index of the server named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        (0..Self::SIZE as usize).find(|&i| self.server_name(i) == name)
    }

    /// Where server `i`'s log is.
    pub fn log(&self, i: usize) -> std::path::PathBuf {
        self.store.join(format!("{i}.log"))
    }

    fn route(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.first + Self::SIZE + i as u16)
    }

    fn spawn(&mut self, i: usize) {
        let routes: Vec<String> = (0..Self::SIZE as usize).filter(|&j| j != i).map(|j| self.route(j)).collect();
        let child = std::process::Command::new(crate::repo_root().join("scripts/nats-server"))
            .args(["-a", "127.0.0.1", "-p", &(self.first + i as u16).to_string(), "-js", "-sd"])
            .arg(self.store.join(i.to_string()))
            .args(["--cluster", &self.route(i), "--routes", &routes.join(","), "--cluster_name", &self.name, "--server_name", &self.server_name(i)])
            .arg("-l")
            .arg(self.log(i))
            .spawn()
            .expect("scripts/nats-server starts");
        self.servers[i] = Some(child);
    }

    async fn wait_for_clients(&self, i: usize) {
        let url = self.url(i);
        crate::until(&format!("cluster server {i} on {url}"), Duration::from_secs(20), async || async_nats::connect(&url).await.is_ok()).await;
    }

    /// Until JetStream takes a stream of three replicas: a meta leader elected, every server its peer.
    /// (Not `$JS.API.INFO`: async-nats 0.51 cannot read the answer of 2.9 to it.)
    async fn wait_for_jetstream(&self) {
        let jetstream = self.jetstream().await;
        let (probe, subject) = unique("cluster-probe");
        crate::until(&format!("a stream of three replicas in cluster {}", self.name), Duration::from_secs(30), async || {
            let config = stream::Config { name: probe.clone(), subjects: vec![subject.clone()], num_replicas: 3, ..Default::default() };
            jetstream.get_or_create_stream(config).await.is_ok()
        })
        .await;
        jetstream.delete_stream(&probe).await.ok();
    }

    /// A client of the cluster (any server up).
    pub async fn jetstream(&self) -> jetstream::Context {
        connect_to(&self.urls()).await
    }

    /// Starts server `i` again on its ports and store; returns once it takes connections.
    pub async fn run(&mut self, i: usize) {
        assert!(self.servers[i].is_none(), "cluster server {i} is running already");
        self.spawn(i);
        self.wait_for_clients(i).await;
    }

    /// `kill -9` server `i`, and waits for the process to be gone.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for i in 0..Self::SIZE as usize {
            self.kill9(i);
        }
        if std::thread::panicking() {
            eprintln!("the cluster's stores and logs are kept in {}", self.store.display());
        } else {
            std::fs::remove_dir_all(&self.store).ok();
        }
    }
}

/// Streams a test made on a shared server, deleted when this is dropped: at
/// the end of a test that passed, and while one that failed unwinds, so a
/// failing run leaves nothing behind. Drop cannot await: the deletes run on a
/// thread of their own with a runtime of its own, joined before the drop ends.
pub struct Cleanup {
    url: String,
    streams: Vec<String>,
}

impl Cleanup {
    /// `streams` on the server at `url`.
    pub fn on(url: &str, streams: &[String]) -> Cleanup {
        Cleanup { url: url.to_string(), streams: streams.to_vec() }
    }

    /// A held stream, its parked stream and the clock stream named after it on the server under test.
    pub fn held(held: &str) -> Cleanup {
        Cleanup::on(&nats_url(), &[held.to_string(), format!("{held}-parked"), format!("{held}-clock")])
    }

    /// The streams hourglass makes for subjects (its ingress, canary): each named like the subject with '.' as '-'.
    pub fn subjects(subjects: &[&str]) -> Cleanup {
        Cleanup::on(&nats_url(), &subjects.iter().map(|s| s.replace('.', "-")).collect::<Vec<_>>())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (url, streams) = (self.url.clone(), std::mem::take(&mut self.streams));
        let deleting = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(url.as_str())).await else { return };
                let jetstream = jetstream::new(client);
                for stream in streams {
                    let _ = tokio::time::timeout(Duration::from_secs(5), jetstream.delete_stream(&stream)).await;
                }
            });
        });
        let _ = deleting.join();
    }
}
