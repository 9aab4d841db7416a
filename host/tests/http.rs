//! The HTTP API on the in-memory broker: everything that is decided before a
//! broker is reached. Each refusal names its field and is JSON (413 too);
//! /metrics is behind the token and its labels are bounded; idle, slow and
//! too many connections cannot take the API down.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hourglass::broker;
use hourglass::command::Command as BrokerCommand;
use hourglass::config::Config;
use hourglass::executor::{Broker, Envelope, Executor, ExecutorError};
use hourglass::scheduler::Scheduler;
use hourglass::scheduler::strategies::Strategies;
use hourglass::service::{self, Service};
use serde_json::{Value, json};

const TOKEN: &str = "secret";

fn config(service: &str) -> Config {
    let text = format!("[broker]\nkind = \"memory\"\n\n[service]\n{service}\n\n[strategies.main]\nplanner = \"binary-levels\"\n\n[destinations.orders]\n");
    Config::parse(Path::new("http-test.toml"), text).expect("test config")
}

/// A service on the memory broker, served on a port of its own in a runtime of its own.
struct Served {
    address: SocketAddr,
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Served {
    fn start(service_toml: &str, token: Option<&str>) -> Served {
        Served::start_on(service_toml, token, None)
    }

    /// On `broker` when given, else on the memory broker.
    fn start_on(service_toml: &str, token: Option<&str>, broker: Option<Broker>) -> Served {
        let config = config(service_toml);
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (address, stop, server) = runtime.block_on(async {
            let strategies = Strategies::load(&config).expect("strategies");
            let broker = match broker {
                Some(broker) => broker,
                None => broker::connect(&config.broker).await.expect("memory broker"),
            };
            let service = Service::new(Scheduler::new(&config, strategies, broker), token.map(String::from));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(service::run(listener, service, async move {
                stopped.await.ok();
            }));
            (address, stop, server)
        });
        Served { address, runtime, stop: Some(stop), server: Some(server) }
    }

    /// `(status, body as JSON or as a string)`.
    fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>) -> (u16, Value) {
        call(self.address, method, path, token, body)
    }

    fn schedule(&self, body: Value) -> (u16, Value) {
        self.call("POST", "/v1/messages", Some(TOKEN), Some(body.to_string().as_bytes()))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let (Some(stop), Some(server)) = (self.stop.take(), self.server.take()) {
            stop.send(()).ok();
            let stopped = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(30), server).await });
            if !std::thread::panicking() {
                stopped.expect("shutdown within 30 s").unwrap().expect("graceful shutdown");
            }
        }
    }
}

fn call(address: SocketAddr, method: &str, path: &str, token: Option<&str>, body: Option<&[u8]>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into();
    let url = format!("http://{address}{path}");
    let auth = token.map(|t| format!("Bearer {t}"));
    let response = match method {
        "POST" => {
            let mut request = agent.post(&url).header("content-type", "application/json");
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.send(body.unwrap_or_default())
        }
        _ => {
            let mut request = agent.get(&url);
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.call()
        }
    };
    let mut response = response.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let text = response.body_mut().with_config().limit(16 << 20).read_to_string().unwrap_or_default();
    (response.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn assert_refused(answer: &(u16, Value), status: u16, field: &str) {
    let (got, body) = answer;
    assert_eq!(*got, status, "{body}");
    assert!(body.is_object(), "a JSON error, not {body}");
    assert_eq!(body["field"], field, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}");
}

/// Requests the API refuses, each with its status and the field it names.
fn bad_requests() -> Vec<(Value, u16, &'static str)> {
    let long_name = "d".repeat(256);
    vec![
        (json!({ "delay": "1s", "body": "x" }), 400, "destination"),
        (json!({ "destination": "", "delay": "1s" }), 400, "destination"),
        (json!({ "destination": 5, "delay": "1s" }), 400, "destination"),
        (json!({ "destination": long_name, "delay": "1s" }), 400, "destination"),
        (json!({ "destination": "orders", "body": "x" }), 400, "delay"),
        (json!({ "destination": "orders", "delay": -5 }), 400, "delay"),
        (json!({ "destination": "orders", "delay": "soon" }), 400, "delay"),
        (json!({ "destination": "orders", "delay": true }), 400, "delay"),
        (json!({ "destination": "orders", "deliver_at": "tomorrow" }), 400, "deliver_at"),
        (json!({ "destination": "orders", "deliver_at": 1_795_456_800_000u64 }), 400, "deliver_at"),
        (json!({ "destination": "orders", "delay": "1s", "deliver_at": "2026-11-23T18:00:00Z" }), 400, "deliver_at"),
        // Past the strategy's longest delay (binary levels: about 8.5 years): the planner refuses it.
        (json!({ "destination": "orders", "deliver_at": "2100-01-01T00:00:00Z" }), 400, "deliver_at"),
        (json!({ "destination": "orders", "delay": "1s", "body": 7 }), 400, "body"),
        (json!({ "destination": "orders", "delay": "1s", "body": "%%%", "encoding": "base64" }), 400, "body"),
        (json!({ "destination": "orders", "delay": "1s", "encoding": "rot13" }), 400, "encoding"),
        (json!({ "destination": "orders", "delay": "1s", "headers": ["a"] }), 400, "headers"),
        (json!({ "destination": "orders", "delay": "1s", "headers": { "a": 1 } }), 400, "headers"),
        (json!({ "destination": "orders", "delay": "1s", "headers": { "hourglass-due-at": "1" } }), 400, "headers"),
        (json!({ "destination": "orders", "delay": "1s", "headers": { "CC": "other-queue" } }), 400, "headers"),
        (json!({ "destination": "orders", "delay": "1s", "strategy": 3 }), 400, "strategy"),
        (json!({ "destination": "orders", "delay": "1s", "strategy": "nope" }), 400, "strategy"),
        (json!({ "destination": "orders", "delay": "1s", "colour": "red" }), 400, "request"),
        (json!(["not", "an", "object"]), 400, "request"),
        (json!({ "destination": "orders", "delay": "1s", "body": "x".repeat(300_000) }), 413, "body"),
    ]
}

#[test]
fn every_refusal_names_its_field_and_valid_requests_beside_them_are_accepted() {
    let served = Served::start("", Some(TOKEN));
    let valid = || json!({ "destination": "orders", "delay": "10s", "body": "ok" });
    let bad = bad_requests();
    let mut accepted = 0;
    for (body, status, field) in &bad {
        assert_refused(&served.schedule(body.clone()), *status, field);
        let (status, answer) = served.schedule(valid());
        assert_eq!(status, 202, "a valid request after a bad one: {answer}");
        accepted += 1;
    }
    assert_refused(&served.call("POST", "/v1/messages", Some(TOKEN), Some(b"{not json")), 400, "request");
    assert_refused(&served.call("POST", "/v1/messages", Some("wrong"), Some(valid().to_string().as_bytes())), 401, "authorization");
    assert_refused(&served.call("POST", "/v1/messages", None, Some(valid().to_string().as_bytes())), 401, "authorization");
    assert_refused(&served.call("GET", "/v1/plan?delay=1s", Some(TOKEN), None), 400, "destination");
    assert_refused(&served.call("GET", "/v1/plan?destination=orders&delay=soon", Some(TOKEN), None), 400, "delay");
    assert_refused(&served.call("GET", "/v1/topology?format=svg", Some(TOKEN), None), 400, "format");

    let (status, metrics) = served.call("GET", "/metrics", Some(TOKEN), None);
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap().to_string();
    let sample = |line: &str| metrics.lines().find(|l| l.starts_with(line)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(sample("hourglass_messages_scheduled_total{strategy=\"main\",destination=\"orders\"}"), Some(accepted as f64), "{metrics}");
    let sum = |family: &str| -> f64 { metrics.lines().filter(|l| l.starts_with(family)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum() };
    // Refused while parsing (rejected), or by the scheduler's check (failed): every one counted once.
    let (rejected, failed) = (sum("hourglass_requests_rejected_total"), sum("hourglass_messages_failed_total"));
    assert_eq!(rejected + failed, bad.len() as f64 + 1.0, "the bad requests and the one that is not JSON; not the 401s: {metrics}");
}

/// A batch answers each item as `POST /v1/messages` would answer it alone,
/// in order; a body that is not a batch is refused whole, naming why.
#[test]
fn a_batch_answers_each_item_as_alone_and_a_malformed_batch_is_refused_whole() {
    let served = Served::start("", Some(TOKEN));
    let bad = bad_requests();
    let mut messages = Vec::new();
    for (body, _, _) in &bad {
        messages.push(body.clone());
        messages.push(json!({ "destination": "orders", "delay": "10s", "body": "ok" }));
    }
    let batch = |body: Value| served.call("POST", "/v1/messages:batch", Some(TOKEN), Some(body.to_string().as_bytes()));
    let (status, answer) = batch(json!({ "messages": messages }));
    assert_eq!(status, 200, "{answer}");
    assert_eq!((answer["scheduled"].as_u64(), answer["failed"].as_u64()), (Some(bad.len() as u64), Some(bad.len() as u64)), "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), messages.len());
    for (i, (sent, status, field)) in bad.iter().enumerate() {
        let (refused, accepted) = (&results[2 * i], &results[2 * i + 1]);
        assert_eq!((refused["status"].as_u64(), refused["field"].as_str()), (Some(u64::from(*status)), Some(*field)), "{sent} answered {refused}");
        assert!(refused["error"].as_str().is_some_and(|e| !e.is_empty()), "{refused}");
        assert_eq!(accepted["status"], 202, "the valid item after {sent}: {accepted}");
        assert!(accepted["id"].as_str().is_some_and(|id| !id.is_empty()) && accepted["due_at"].is_u64(), "{accepted}");
    }

    let one = json!({ "destination": "orders", "delay": "1s" });
    assert_refused(&batch(json!({ "messages": vec![one.clone(); 1_001] })), 400, "messages");
    assert_refused(&batch(json!({ "messages": [] })), 400, "messages");
    assert_refused(&batch(json!({ "messages": one })), 400, "messages");
    assert_refused(&batch(json!({ "message": [one] })), 400, "request");
    assert_refused(&batch(json!({})), 400, "messages");
    assert_refused(&batch(json!([one])), 400, "request");
    assert_refused(&served.call("POST", "/v1/messages:batch", Some(TOKEN), Some(b"{not json")), 400, "request");
    assert_refused(&served.call("POST", "/v1/messages:batch", None, Some(json!({ "messages": [one] }).to_string().as_bytes())), 401, "authorization");
    let (status, answer) = batch(json!({ "messages": vec![one; 1_000] }));
    assert_eq!((status, answer["scheduled"].as_u64()), (200, Some(1_000)), "a full batch");
}

/// A broker that takes every message at once but a body `down` (it cannot
/// take it now) and a body `slow` (counted in `slow_sent`, then confirmed
/// once the test lets it: a permit of `slow`, which starts with none).
struct Flaky {
    slow: std::sync::Arc<tokio::sync::Semaphore>,
    slow_sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Flaky {
    fn new() -> Flaky {
        Flaky { slow: std::sync::Arc::new(tokio::sync::Semaphore::new(0)), slow_sent: Default::default() }
    }
}

impl Executor for Flaky {
    async fn apply(&self, _: &[BrokerCommand]) -> Result<(), ExecutorError> {
        Ok(())
    }
    async fn check_destination(&self, _: &str) -> Result<(), ExecutorError> {
        Ok(())
    }
    async fn send(&self, _: &[BrokerCommand], envelope: &Envelope) -> Result<(), ExecutorError> {
        match envelope.body.as_slice() {
            b"down" => Err(ExecutorError::Unavailable("the test broker is down for this one".into())),
            b"slow" => {
                self.slow_sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                self.slow.acquire().await.expect("the semaphore stays open").forget();
                Ok(())
            }
            _ => Ok(()),
        }
    }
    fn describe(&self) -> String {
        "a test broker".into()
    }
}

/// `POST /v1/messages:batch`: status, `Retry-After`, answer.
fn post_batch(address: SocketAddr, messages: Vec<Value>) -> (u16, Option<String>, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut response = agent.post(&format!("http://{address}/v1/messages:batch")).send_json(json!({ "messages": messages })).expect("an answer");
    let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(String::from);
    let text = response.body_mut().with_config().limit(16 << 20).read_to_string().unwrap();
    (response.status().as_u16(), retry_after, serde_json::from_str(&text).unwrap())
}

/// A broker that cannot take a message of a batch: the messages before it
/// are scheduled, those not yet tried are answered 503 without trying, and
/// the answer says when to send them again.
#[test]
fn a_batch_stops_trying_once_the_broker_cannot_take_a_message() {
    let served = Served::start_on("", None, Some(Broker::new(std::sync::Arc::new(Flaky::new()))));
    let message = |body: &str| json!({ "destination": "orders", "delay": "1s", "body": body });
    let mut messages = vec![message("fine")];
    messages.push(message("down"));
    messages.extend(std::iter::repeat_n(message("fine"), 500));
    let (status, retry_after, answer) = post_batch(served.address, messages);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(retry_after.as_deref(), Some("5"), "a 503 among the results: send those again after Retry-After");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], 202, "{}", results[0]);
    assert_eq!(results[1]["status"], 503, "{}", results[1]);
    let not_tried = results[2..].iter().filter(|r| r["status"] == 503 && r["error"].as_str().is_some_and(|e| e.starts_with("not tried"))).count();
    assert!(not_tried >= 400, "{not_tried} of the 500 after it answered without trying: {answer}");
    // A batch the broker takes whole has no Retry-After.
    let (status, retry_after, answer) = post_batch(served.address, vec![message("fine"); 3]);
    assert_eq!((status, retry_after, answer["scheduled"].as_u64()), (200, None, Some(3)), "{answer}");
}

/// Four batches at once on a host; a fifth is answered 503 until one ends.
#[test]
fn a_fifth_batch_at_once_is_answered_503_with_retry_after() {
    let broker = Flaky::new();
    let (slow, slow_sent) = (broker.slow.clone(), broker.slow_sent.clone());
    let served = Served::start_on("", None, Some(Broker::new(std::sync::Arc::new(broker))));
    let address = served.address;
    // Four batches whose message the broker holds until the test lets it go.
    let held: Vec<_> =
        (0..4).map(|_| std::thread::spawn(move || post_batch(address, vec![json!({ "destination": "orders", "delay": "1s", "body": "slow" })]))).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while slow_sent.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "the four held batches did not reach the broker in 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let quick = || post_batch(address, vec![json!({ "destination": "orders", "delay": "1s", "body": "fine" })]);
    let (status, retry_after, answer) = quick();
    assert_eq!((status, retry_after.as_deref()), (503, Some("5")), "a fifth batch while four are in: {answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("4 batches")), "{answer}");
    slow.add_permits(4);
    for batch in held {
        let (status, _, answer) = batch.join().unwrap();
        assert_eq!((status, answer["scheduled"].as_u64()), (200, Some(1)), "{answer}");
    }
    assert_eq!(quick().0, 200, "a batch once the others ended");
}

#[test]
fn a_request_over_the_size_limit_gets_json_413_naming_the_body() {
    let served = Served::start("", Some(TOKEN));
    // Over the JSON request limit itself (twice the body limit), refused before
    // parsing. The client sends the whole request before it reads the answer,
    // so the server must read what is left before answering (up to its drain
    // limit, 16 MiB) or the client sees a reset connection instead of the 413.
    for length in [700_000, 3_000_000, 12_000_000] {
        let huge = json!({ "destination": "orders", "delay": "1s", "body": "x".repeat(length) });
        assert_refused(&served.schedule(huge), 413, "body");
    }
    let (status, answer) = served.schedule(json!({ "destination": "orders", "delay": "1s", "body": "fits" }));
    assert_eq!(status, 202, "{answer}");
}

#[test]
fn metrics_need_the_token_when_one_is_set_and_labels_stay_bounded() {
    let served = Served::start("", Some(TOKEN));
    assert_refused(&served.call("GET", "/metrics", None, None), 401, "authorization");
    assert_refused(&served.call("GET", "/metrics", Some("wrong"), None), 401, "authorization");
    for i in 0..50 {
        let (status, answer) = served.schedule(json!({ "destination": format!("random-{i}"), "delay": "1s" }));
        assert_eq!(status, 202, "{answer}");
    }
    let (status, answer) = served.schedule(json!({ "destination": "orders", "delay": "1s" }));
    assert_eq!(status, 202, "{answer}");
    let (status, metrics) = served.call("GET", "/metrics", Some(TOKEN), None);
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap();
    assert!(!metrics.contains("random-"), "client-chosen names never become labels: {metrics}");
    assert!(metrics.contains("hourglass_messages_scheduled_total{strategy=\"main\",destination=\"other\"} 50"), "{metrics}");
    assert!(metrics.contains("hourglass_messages_scheduled_total{strategy=\"main\",destination=\"orders\"} 1"), "{metrics}");

    // Without a token configured, /metrics is open like the rest.
    let open = Served::start("", None);
    assert_eq!(open.call("GET", "/metrics", None, None).0, 200);
}

/// The Grafana dashboard in examples/grafana names only metrics `serve`
/// registers: a renamed metric fails here, not silently in a panel.
#[test]
fn the_grafana_dashboard_names_only_metrics_serve_exports() {
    let metrics = hourglass::metrics::Metrics::default();
    // The core's families, and those a broker registers when its side starts.
    let mut registered = metrics.families();
    registered.extend(hourglass::broker::registry::metric_families().iter().map(|family| format!("hourglass_{}", family.name)));
    let dashboard = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/grafana/hourglass.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    let mut named = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("hourglass_") {
                let name: String = expr[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                named.push(name);
            }
        }
    }
    assert!(named.len() >= 10, "{named:?}");
    for name in named {
        // A counter is declared `foo` and sampled `foo_total`; a histogram `foo`, sampled `foo_bucket`.
        let family = ["_total", "_bucket", "_sum", "_count"].iter().find_map(|suffix| name.strip_suffix(suffix)).unwrap_or(&name);
        assert!(registered.iter().any(|r| r == family), "the dashboard names {name}, which serve does not export; registered: {registered:?}");
    }
}

/// A browser cannot send a bearer token: with a token set, the status page
/// asks for it as HTTP Basic's password; without the token nothing is shown.
#[test]
fn the_status_page_is_behind_the_token_and_a_browser_can_give_it() {
    use base64::Engine;
    let served = Served::start("", Some(TOKEN));
    let (status, body) = served.call("GET", "/", None, None);
    assert_eq!(status, 401);
    assert!(!body.to_string().contains("<table"), "nothing of the page without the token: {body}");
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let url = format!("http://{}/", served.address);
    let refused = agent.get(&url).call().unwrap();
    let challenge = refused.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(challenge.starts_with("Basic realm=\"hourglass\""), "{challenge}");
    let wrong = base64::engine::general_purpose::STANDARD.encode("admin:nope");
    assert_eq!(agent.get(&url).header("Authorization", format!("Basic {wrong}")).call().unwrap().status().as_u16(), 401);
    let right = base64::engine::general_purpose::STANDARD.encode(format!("anyone:{TOKEN}"));
    let mut page = agent.get(&url).header("Authorization", format!("Basic {right}")).call().unwrap();
    assert_eq!(page.status().as_u16(), 200);
    let html = page.body_mut().read_to_string().unwrap();
    assert!(html.contains("<tr data-strategy=\"main\">") && html.contains("graph TD"), "{html}");
    let (status, _) = served.call("GET", "/", Some(TOKEN), None);
    assert_eq!(status, 200, "the API's bearer token opens it too");
}

#[test]
fn an_empty_token_is_a_config_error() {
    let text = "[broker]\nkind = \"memory\"\n[service]\ntoken = \"\"\n[strategies.main]\nplanner = \"binary-levels\"\n";
    let err = Config::parse(Path::new("http-test.toml"), text.into()).unwrap_err().to_string();
    assert!(err.starts_with("http-test.toml:4:") && err.contains("service.token: empty"), "{err}");
}

/// Reads until the server closes the connection; `Err` if it is still open after `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buffer = [0u8; 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(started.elapsed()),
            // A 408 may come first; the close follows.
            Ok(_) => continue,
            Err(err) if matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(format!("still open after {:?}", started.elapsed()));
            }
            Err(_) => return Ok(started.elapsed()),
        }
    }
}

#[test]
fn idle_and_slowloris_connections_are_closed_after_the_header_read_timeout() {
    let served = Served::start("header_read_timeout = \"1s\"", None);
    // Sends nothing at all.
    let mut idle = TcpStream::connect(served.address).unwrap();
    // Sends a request line, then one header byte every 200 ms, never finishing.
    let mut slow = TcpStream::connect(served.address).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut trickle = slow.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for _ in 0..50 {
            if trickle.write_all(b"a").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let idle_closed = closed_within(&mut idle, Duration::from_secs(5)).expect("the idle connection closed");
    let slow_closed = closed_within(&mut slow, Duration::from_secs(5)).expect("the slowloris connection closed");
    assert!(idle_closed >= Duration::from_millis(800), "closed after {idle_closed:?}: too early");
    assert!(slow_closed <= Duration::from_secs(3), "closed after {slow_closed:?}");
    writer.join().unwrap();
    // A well-behaved client is served meanwhile.
    assert_eq!(served.call("GET", "/healthz", None, None).0, 200);
}

/// A request whose body stops coming is cut once no byte moved for
/// `idle_timeout`; one whose body keeps coming, however slowly, is not, and
/// is answered when it is whole. A client that keeps to the API meanwhile is served.
#[test]
fn a_stalled_body_is_cut_at_the_idle_timeout_and_a_slow_one_is_answered() {
    let served = Served::start("idle_timeout = \"1s\"\nheader_read_timeout = \"30s\"", None);
    let body = serde_json::json!({ "destination": "orders", "delay": "1h", "body": "slow" }).to_string();
    let head = format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    let mut stalled = TcpStream::connect(served.address).unwrap();
    stalled.write_all(head.as_bytes()).unwrap();
    stalled.write_all(&body.as_bytes()[..5]).unwrap();
    let started = Instant::now();
    // The slow one sends its body a byte at a time over 4 s, four idle timeouts.
    let mut slow = TcpStream::connect(served.address).unwrap();
    slow.write_all(head.as_bytes()).unwrap();
    let mut trickle = slow.try_clone().unwrap();
    let bytes = body.into_bytes();
    let step = Duration::from_secs(4) / bytes.len() as u32;
    let writer = std::thread::spawn(move || {
        for byte in bytes {
            trickle.write_all(&[byte]).unwrap();
            std::thread::sleep(step);
        }
    });
    let stalled_closed = closed_within(&mut stalled, Duration::from_secs(5)).expect("the stalled connection closed");
    assert!(stalled_closed >= Duration::from_millis(900), "closed after {stalled_closed:?}: before the idle timeout");
    assert!(stalled_closed <= Duration::from_millis(2_500), "closed after {stalled_closed:?}");
    assert_eq!(served.call("GET", "/healthz", None, None).0, 200);
    writer.join().unwrap();
    assert!(started.elapsed() > Duration::from_secs(2), "the slow body took {:?}: no longer than the idle timeout", started.elapsed());
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    let mut reader = std::io::BufReader::new(slow);
    std::io::BufRead::read_line(&mut reader, &mut answer).expect("an answer to the slow request");
    assert!(answer.starts_with("HTTP/1.1 202"), "the slow request was answered {answer:?}");
}

#[test]
fn at_max_connections_a_new_one_waits_for_a_free_slot() {
    let served = Served::start("max_connections = 2\nheader_read_timeout = \"30s\"", None);
    let first = TcpStream::connect(served.address).unwrap();
    let _second = TcpStream::connect(served.address).unwrap();
    let address = served.address;
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let answer = call(address, "GET", "/healthz", None, None);
        done_tx.send((answer.0, Instant::now())).ok();
    });
    assert!(done.recv_timeout(Duration::from_secs(1)).is_err(), "a third connection was served while two were open");
    let freed = Instant::now();
    drop(first);
    let (status, answered) = done.recv_timeout(Duration::from_secs(5)).expect("served once a slot was free");
    assert_eq!(status, 200);
    assert!(answered.duration_since(freed) < Duration::from_secs(2));
}

/// `hourglass serve` in a child process limited to 1,024 file descriptors.
struct Child1024 {
    child: Child,
    address: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Child1024 {
    fn start(service_toml: &str) -> Child1024 {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("delay.toml");
        std::fs::write(
            &config,
            format!("[broker]\nkind = \"memory\"\n[service]\nlisten = \"127.0.0.1:0\"\n{service_toml}\n[strategies.main]\nplanner = \"binary-levels\"\n"),
        )
        .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_hourglass"));
        command
            .args(["--config", config.to_str().unwrap(), "serve"])
            .env("HOURGLASS_CACHE_DIR", dir.path().join("cache"))
            .env_remove("HOURGLASS_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                let limit = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().expect("start hourglass serve");
        let stderr = child.stderr.take().unwrap();
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("hourglass serving on http://") {
                    address_tx.send(rest.split(' ').next().unwrap().parse::<SocketAddr>().unwrap()).ok();
                }
            }
        });
        let address = address_rx.recv_timeout(Duration::from_secs(60)).expect("hourglass serve started");
        Child1024 { child, address, _dir: dir }
    }
}

impl Drop for Child1024 {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

#[test]
fn two_thousand_idle_connections_do_not_stop_the_api() {
    let served = Child1024::start("header_read_timeout = \"2s\"");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let address = served.address;
    let idle: Vec<tokio::net::TcpStream> = runtime.block_on(async {
        let connects = (0..2_000)
            .map(|_| async move { tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(address)).await.ok().and_then(Result::ok) });
        futures_util::future::join_all(connects).await.into_iter().flatten().collect()
    });
    assert!(idle.len() > 1_100, "only {} idle connections opened: more than the server's 1,024 descriptors are needed", idle.len());
    let started = Instant::now();
    let (status, body) = call(address, "POST", "/v1/messages", None, Some(json!({ "destination": "orders", "delay": "1s" }).to_string().as_bytes()));
    assert_eq!(status, 202, "{body}");
    assert!(started.elapsed() < Duration::from_secs(45), "answered after {:?}", started.elapsed());
    eprintln!("{} idle connections open; a request answered after {:?}", idle.len(), started.elapsed());
    drop(idle);
    drop(runtime);
}

#[test]
fn listening_beyond_loopback_without_a_token_warns() {
    let dir = tempfile::tempdir().unwrap();
    let run = |service: &str| {
        let config = dir.path().join("delay.toml");
        std::fs::write(&config, format!("[broker]\nkind = \"memory\"\n[service]\n{service}\n[strategies.main]\nplanner = \"binary-levels\"\n")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["--config", config.to_str().unwrap(), "serve", "--listen", "0.0.0.0:0"])
            .env("HOURGLASS_CACHE_DIR", dir.path().join("cache"))
            .env_remove("HOURGLASS_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                lines_tx.send(line).ok();
            }
        });
        // Everything up to the "serving on" line, and what follows it at once.
        let mut seen = Vec::new();
        while let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) {
            let serving = line.contains("hourglass serving on");
            seen.push(line);
            if serving {
                let until = Instant::now() + Duration::from_secs(3);
                while let Ok(line) = lines.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    let warned = line.contains("beyond loopback");
                    seen.push(line);
                    if warned {
                        break;
                    }
                }
                break;
            }
        }
        child.kill().ok();
        child.wait().ok();
        seen.join("\n")
    };
    let open = run("");
    assert!(open.contains("hourglass serving on"), "{open}");
    assert!(open.contains("beyond loopback with no token"), "{open}");
    let guarded = run("token = \"t\"");
    assert!(guarded.contains("hourglass serving on"), "{guarded}");
    assert!(!guarded.contains("beyond loopback"), "{guarded}");
}

/// The container serves on all interfaces, so its entrypoint refuses to start
/// hourglass without a token. Run with a stand-in `hourglass` on PATH.
#[test]
fn the_container_recipe_refuses_to_serve_without_a_token() {
    let recipe = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/Containerfile")).unwrap();
    let entrypoint = recipe.lines().find_map(|l| l.strip_prefix("ENTRYPOINT ")).expect("an ENTRYPOINT");
    let argv: Vec<String> = serde_json::from_str(entrypoint).expect("exec form");
    let bin = tempfile::tempdir().unwrap();
    let ran = bin.path().join("ran");
    let fake = bin.path().join("hourglass");
    std::fs::write(&fake, format!("#!/bin/sh\necho \"$@\" > {}\n", ran.display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let run = |token: Option<&str>| {
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).env_clear().env("PATH", &path);
        if let Some(token) = token {
            command.env("HOURGLASS_TOKEN", token);
        }
        command.output().unwrap()
    };
    let refused = run(None);
    assert!(!refused.status.success(), "started without a token");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("HOURGLASS_TOKEN"), "{:?}", refused);
    assert!(!ran.exists(), "hourglass ran without a token");
    let started = run(Some("t0ken"));
    assert!(started.status.success(), "{started:?}");
    let args = std::fs::read_to_string(&ran).expect("hourglass ran with a token");
    assert!(args.contains("serve --listen 0.0.0.0:8080"), "{args}");
}
