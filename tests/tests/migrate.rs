//! `hourglass migrate delayed-exchange`: the test broker has no delayed-message
//! plugin, so a stand-in management API describes the plugin's exchange (in
//! the JSON shape RabbitMQ's management API gives), while `--apply` makes the
//! `deliver_to` exchange and its bindings on the real broker, over AMQP.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass_e2e::*;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::{Value, json};

/// A management API that answers GETs from a fixed map (path without its
/// query → JSON; anything else 404), one request per connection, and keeps
/// every request line it saw.
struct StandIn {
    /// `http://guest:guest@127.0.0.1:PORT`
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl StandIn {
    fn start(answers: HashMap<String, Value>) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://guest:guest@{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        // Ends with the test process; it holds nothing the broker sees.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    continue;
                }
                let mut length = 0;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
                let _ = reader.by_ref().take(length).read_to_end(&mut Vec::new());
                let request = request.trim_end().to_string();
                seen.lock().unwrap().push(request.clone());
                let mut parts = request.split(' ');
                let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let path = target.split('?').next().unwrap_or("");
                let (status, body) = match answers.get(path) {
                    Some(answer) if method == "GET" => ("200 OK", answer.to_string()),
                    Some(_) => ("405 Method Not Allowed", json!({"error": "Method Not Allowed"}).to_string()),
                    None => ("404 Not Found", json!({"error": "Object Not Found", "reason": "Not Found"}).to_string()),
                };
                let _ =
                    write!(stream, "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            }
        });
        StandIn { url, requests }
    }

    /// `http://127.0.0.1:PORT`, as the plan's commands print it.
    fn base(&self) -> String {
        self.url.replace("guest:guest@", "")
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// One binding as `GET /api/exchanges/{vhost}/{name}/bindings/source` lists it.
fn binding(source: &str, destination: &str, destination_type: &str, key: &str, arguments: Value) -> Value {
    json!({"source": source, "vhost": "/", "destination": destination, "destination_type": destination_type,
           "routing_key": key, "arguments": arguments, "properties_key": key})
}

/// The plugin's exchange `name` with `bindings` from it and `into` it, on
/// node `rabbit@standin` (alone in its cluster unless `more_nodes`), holding
/// `delayed` messages (`None`: a plugin that does not report the field).
fn plugin_exchange(name: &str, delayed: Option<u64>, bindings: Vec<Value>, into: Vec<Value>, more_nodes: &[&str]) -> HashMap<String, Value> {
    let mut exchange = json!({"arguments": {"x-delayed-type": "topic"}, "auto_delete": false, "durable": true, "incoming": [],
        "internal": false, "name": name, "outgoing": [], "type": "x-delayed-message", "user_who_performed_action": "guest", "vhost": "/"});
    if let Some(count) = delayed {
        exchange["messages_delayed"] = json!(count);
    }
    let mut nodes = vec![json!({"name": "rabbit@standin", "running": true})];
    nodes.extend(more_nodes.iter().map(|node| json!({"name": node, "running": true})));
    HashMap::from([
        (format!("/api/exchanges/%2F/{name}"), exchange),
        (format!("/api/exchanges/%2F/{name}/bindings/source"), Value::Array(bindings)),
        (format!("/api/exchanges/%2F/{name}/bindings/destination"), Value::Array(into)),
        ("/api/overview".to_string(), json!({"cluster_name": "rabbit@standin", "node": "rabbit@standin", "management_version": "3.10.8"})),
        ("/api/nodes".to_string(), Value::Array(nodes)),
    ])
}

/// A config file on the test broker; `more` is added TOML.
fn config_file(stem: &str, more: &str) -> PathBuf {
    let name = unique(stem);
    let path = std::env::temp_dir().join(format!("{name}.toml"));
    std::fs::write(&path, config_text(&format!("planner = \"binary-levels\"\nprefix = \"{name}\""), more)).unwrap();
    path
}

/// `hourglass --config CONFIG migrate delayed-exchange NAME ARGS --management-url MANAGEMENT`
fn migrate(config: &Path, name: &str, args: &[&str], management: &str) -> Output {
    std::process::Command::new(hourglass_binary())
        .arg("--config")
        .arg(config)
        .args(["migrate", "delayed-exchange", name])
        .args(args)
        .args(["--management-url", management])
        .env_remove("HOURGLASS_MANAGEMENT_URL")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether the real broker has exchange `name` (a passive declare).
async fn exchange_exists(connection: &lapin::Connection, name: &str) -> bool {
    let channel = connection.create_channel().await.unwrap();
    let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
    channel.exchange_declare(name.into(), lapin::ExchangeKind::Topic, passive, FieldTable::default()).await.is_ok()
}

#[test]
fn the_plan_gives_the_config_entry_the_bindings_and_the_code_to_change() {
    let name = unique("migrate-plan");
    let due = format!("{name}.due");
    let bindings = vec![
        binding(&name, "orders-eu", "queue", "order.eu.*", json!({})),
        binding(&name, "audit", "exchange", "#", json!({"x-match": "any", "tenant": "acme"})),
        binding(&name, "odd", "queue", "order.odd", json!({"ratio": 0.5})),
    ];
    let into = vec![binding("upstream", &name, "exchange", "orders.#", json!({}))];
    let standin = StandIn::start(plugin_exchange(&name, Some(0), bindings, into, &[]));
    let config = config_file("migrate-plan", "");

    let output = migrate(&config, &name, &[], &standin.url);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", text(&output.stderr));
    assert!(stdout.contains(&format!("Plugin exchange {name:?} in vhost \"/\"")), "{stdout}");
    assert!(stdout.contains("x-delayed-type    topic"), "{stdout}");
    assert!(stdout.contains("delayed messages  0 on rabbit@standin"), "{stdout}");
    let toml = format!("    [exchanges.\"{name}\"]\n    type = \"topic\"\n    deliver_to = \"{due}\"\n");
    assert!(stdout.contains(&toml), "the TOML block is missing:\n{stdout}");
    // The bindings to make on deliver_to, and the one --apply cannot make.
    let row = |parts: &[&str]| stdout.lines().any(|line| parts.iter().all(|p| line.contains(p)) && line.starts_with("    "));
    assert!(row(&["orders-eu", "queue", "order.eu.*"]), "{stdout}");
    assert!(row(&["audit", "exchange", "#", "tenant=\"acme\"", "x-match=\"any\""]), "{stdout}");
    assert!(stdout.contains("Bind these yourself"), "{stdout}");
    assert!(stdout.contains("queue \"odd\", key \"order.odd\": hourglass cannot declare it over AMQP: argument ratio = 0.5"), "{stdout}");
    // The code to change: declarations, never the publishes.
    assert!(stdout.contains("3. Change the exchange declarations, never the publishes:"), "{stdout}");
    assert!(stdout.contains(&format!("Producers: stop declaring {name:?} (type x-delayed-message); hourglass declares it.")), "{stdout}");
    assert!(stdout.contains(&format!("Every publish stays as it is: exchange {name:?}, its routing key, its x-delay header.")), "{stdout}");
    assert!(stdout.contains(&format!("Consumers: bind each queue to {due:?} (declare it as a durable topic exchange)")), "{stdout}");
    // The cut-over: the plugin's exchange is the user's to delete, with this command, before hourglass declares the name.
    let delete = format!("curl -u guest -X DELETE {}/api/exchanges/%2F/{name}", standin.base());
    assert!(stdout.contains(&delete), "{stdout}");
    let order = [
        "a. Stop the producers",
        "b. Wait until this command shows 0",
        "c. Run this command again with --apply",
        "d. Deploy the consumers'",
        &delete,
        "f. Start (or restart) hourglass serve",
        "g. Bind again what was bound into",
        "h. Start the producers",
    ];
    let positions: Vec<usize> = order.iter().map(|step| stdout.find(step).unwrap_or_else(|| panic!("{step:?} missing:\n{stdout}"))).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "steps out of order:\n{stdout}");
    let body = json!({"routing_key": "orders.#", "arguments": {}});
    let rebind = format!("curl -u guest -X POST -H 'content-type: application/json' -d '{body}' {}/api/bindings/%2F/e/upstream/e/{name}", standin.base());
    assert!(stdout.contains(&rebind), "{stdout}");
    assert!(stdout.contains(&format!("--apply would declare {due:?} and make 2 binding(s) on it now.")), "{stdout}");

    let output = migrate(&config, &name, &["--format", "json"], &standin.url);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(plan["deliver_to"], due);
    assert_eq!(plan["exchange"]["delayed_type"], "topic");
    assert_eq!(plan["exchange"]["messages_delayed"]["nodes"], json!([{"node": "rabbit@standin", "messages_delayed": 0}]));
    assert_eq!(plan["blocked"], Value::Null);
    assert_eq!(plan["delete_command"], delete);
    let commands: Vec<&str> = plan["commands"].as_array().unwrap().iter().map(|c| c["command"].as_str().unwrap()).collect();
    assert_eq!(commands, ["declare-exchange", "bind-queue", "bind-exchange"]);
    assert_eq!(plan["commands"][0], json!({"command": "declare-exchange", "name": due, "kind": "topic", "durable": true, "arguments": {}}));
    assert_eq!(plan["commands"][2]["arguments"], json!({"tenant": "acme", "x-match": "any"}));
    assert_eq!(plan["by_hand"][0]["binding"]["destination"], "odd");
    assert_eq!(plan["exchange"]["incoming"][0]["source"], "upstream");
    assert!(plan.get("applied").is_none(), "{plan}");

    // The TOML block is a config entry hourglass loads as it is (delayed exchanges need the ingress).
    let ingress = unique("migrate-ingress");
    let more = format!("[service.ingress]\nenabled = true\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\n\n{}", plan["toml"].as_str().unwrap());
    let loaded = hourglass::config::Config::parse(Path::new("migrated.toml"), config_text("planner = \"binary-levels\"", &more)).unwrap();
    let entry = &loaded.exchanges[&name];
    assert_eq!((entry.deliver_to.as_str(), entry.kind.exchange_kind().as_str()), (due.as_str(), "topic"));

    // Reading is all it did.
    let requests = standin.requests();
    assert!(requests.iter().all(|r| r.starts_with("GET ")), "{requests:?}");
}

#[test]
fn a_config_entry_gives_deliver_to_and_a_differing_type_is_pointed_out() {
    let name = unique("migrate-config");
    let standin = StandIn::start(plugin_exchange(&name, Some(0), vec![binding(&name, "q", "queue", "k", json!({}))], Vec::new(), &[]));
    let ingress = unique("migrate-ingress");
    let entry = format!(
        "[service.ingress]\nenabled = true\nqueue = \"{ingress}\"\ninvalid_queue = \"{ingress}.invalid\"\n\n[exchanges.\"{name}\"]\ntype = \"direct\"\ndeliver_to = \"orders\"\n"
    );
    let config = config_file("migrate-config", &entry);
    let output = migrate(&config, &name, &["--format", "json"], &standin.url);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(plan["deliver_to"], "orders");
    let notes = plan["notes"].to_string();
    assert!(notes.contains("with type = \\\"direct\\\", but the plugin's exchange routes as topic"), "{notes}");
    // --deliver-to wins over the config, and says so.
    let output = migrate(&config, &name, &["--format", "json", "--deliver-to", "elsewhere"], &standin.url);
    let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(plan["deliver_to"], "elsewhere");
    assert!(plan["notes"].to_string().contains("has deliver_to = \\\"orders\\\""), "{}", plan["notes"]);
}

#[tokio::test]
async fn apply_refuses_while_the_plugin_holds_messages_or_cannot_count_them() {
    let connection = connect().await;
    let cleanup = Cleanup::default();
    let config = config_file("migrate-refuse", "");
    let name = unique("migrate-refuse");
    let due = unique("migrate-refuse-due");
    // Should a refusal fail to refuse, what it made goes.
    cleanup.exchange(&due);
    let queue = unique("migrate-refuse-q");
    cleanup.queue(&queue);
    let bindings = || vec![binding(&name, &queue, "queue", "k", json!({}))];

    let cases: [(HashMap<String, Value>, &str); 3] = [
        (plugin_exchange(&name, Some(3), bindings(), Vec::new(), &[]), "the plugin still holds delayed messages: 3 on rabbit@standin"),
        (plugin_exchange(&name, None, bindings(), Vec::new(), &[]), "the exchange has no messages_delayed field"),
        (plugin_exchange(&name, Some(0), bindings(), Vec::new(), &["rabbit@other"]), "node(s) rabbit@other were not asked"),
    ];
    for (answers, why) in cases {
        let standin = StandIn::start(answers);
        let output = migrate(&config, &name, &["--apply", "--deliver-to", &due], &standin.url);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "--apply went ahead: {}", text(&output.stdout));
        assert!(stderr.contains("error: refusing to apply: ") && stderr.contains(why), "{stderr}");
        // The plan is still shown, ending with the reason.
        let stdout = text(&output.stdout);
        assert!(stdout.lines().any(|line| line.starts_with("--apply refuses now: ") && line.contains(why)), "{stdout}");
        assert!(!exchange_exists(&connection, &due).await, "{due} was declared despite the refusal");
        // Without --apply the plan is only information: exit 0, and the JSON says why --apply would refuse.
        let output = migrate(&config, &name, &["--format", "json", "--deliver-to", &due], &standin.url);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(plan["blocked"].as_str().is_some_and(|b| b.contains(why)), "{}", plan["blocked"]);
        assert!(standin.requests().iter().all(|r| r.starts_with("GET ")), "{:?}", standin.requests());
    }
}

#[tokio::test]
async fn apply_declares_deliver_to_and_binds_its_queues_and_exchanges_on_the_real_broker() {
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    let cleanup = Cleanup::default();
    let name = unique("migrate-apply");
    let due = unique("migrate-apply-due");
    let queue = unique("migrate-apply-q");
    let fanout = unique("migrate-apply-x");
    let behind = unique("migrate-apply-xq");
    for made in [&due, &fanout] {
        cleanup.exchange(made);
    }
    for made in [&queue, &behind] {
        cleanup.queue(made);
    }
    // What the plugin's exchange routes to: a queue, and an exchange with a queue behind it.
    channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();
    channel.queue_declare(behind.as_str().into(), QueueDeclareOptions::default(), FieldTable::default()).await.unwrap();
    channel.exchange_declare(fanout.as_str().into(), lapin::ExchangeKind::Fanout, ExchangeDeclareOptions::default(), FieldTable::default()).await.unwrap();
    channel.queue_bind(behind.as_str().into(), fanout.as_str().into(), "".into(), QueueBindOptions::default(), FieldTable::default()).await.unwrap();
    let queue_arguments = json!({"n": 5, "on": true, "tenant": "acme"});
    let bindings = vec![binding(&name, &queue, "queue", "order.eu.*", queue_arguments.clone()), binding(&name, &fanout, "exchange", "order.#", json!({}))];
    let standin = StandIn::start(plugin_exchange(&name, Some(0), bindings, Vec::new(), &[]));
    let config = config_file("migrate-apply", "");

    let output = migrate(&config, &name, &["--apply", "--deliver-to", &due], &standin.url);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", text(&output.stderr));
    assert!(stdout.contains(&format!("done    declare exchange {due:?} (topic, durable)")), "{stdout}");
    assert!(stdout.contains(&format!("done    bind queue {queue:?} to {due:?} with key \"order.eu.*\"")), "{stdout}");
    assert!(stdout.contains(&format!("done    bind exchange {fanout:?} to {due:?} with key \"order.#\"")), "{stdout}");

    // The real broker has deliver_to, of the plugin's x-delayed-type and durable, bound as the plugin's exchange was.
    let made = management("GET", &format!("/api/exchanges/%2F/{due}"), None);
    assert_eq!((made["type"].as_str(), made["durable"].as_bool()), (Some("topic"), Some(true)), "{made}");
    let mut found: Vec<(String, String, String, Value)> = management("GET", &format!("/api/exchanges/%2F/{due}/bindings/source"), None)
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["destination"].as_str().unwrap().into(),
                b["destination_type"].as_str().unwrap().into(),
                b["routing_key"].as_str().unwrap().into(),
                b["arguments"].clone(),
            )
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut wanted = vec![
        (queue.clone(), "queue".to_string(), "order.eu.*".to_string(), queue_arguments),
        (fanout.clone(), "exchange".to_string(), "order.#".to_string(), json!({})),
    ];
    wanted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(found, wanted);

    // And routes as it did: a due message with the original routing key reaches both.
    let properties = BasicProperties::default().with_delivery_mode(2);
    channel.basic_publish(due.as_str().into(), "order.eu.42".into(), BasicPublishOptions::default(), b"due", properties).await.unwrap().await.unwrap();
    assert_eq!(get_at_least(&channel, &queue, 1, Duration::from_secs(10)).await[0].data, b"due");
    assert_eq!(get_at_least(&channel, &behind, 1, Duration::from_secs(10)).await[0].data, b"due");

    // The plugin's exchange was only read: its deletion is the user's step.
    let requests = standin.requests();
    assert!(requests.iter().all(|r| r.starts_with("GET ")), "{requests:?}");

    // A second --apply changes nothing and succeeds.
    let again = migrate(&config, &name, &["--apply", "--deliver-to", &due], &standin.url);
    assert!(again.status.success(), "{}\n{}", text(&again.stdout), text(&again.stderr));
    assert_eq!(management("GET", &format!("/api/exchanges/%2F/{due}/bindings/source"), None).as_array().unwrap().len(), 2);
}
