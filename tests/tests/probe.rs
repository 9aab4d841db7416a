//! `hourglass verify`'s probes against a real RabbitMQ: every mechanism the
//! default strategy relies on passes (and nothing of the probes is left), and
//! a policy that breaks one mechanism for the probes' names is refused,
//! naming it. Each test runs in a vhost of its own, where the strategy's
//! fixed names and the policies touch nobody else.

use std::path::PathBuf;
use std::process::{Command, Output};

use hourglass::broker::rabbitmq::manage::encode;
use hourglass_e2e::vhost::PrivateVhost;
use hourglass_e2e::*;

/// Binary levels as the hourglass preset declares them by default (direct
/// routing on quorum queues), with three levels: every mechanism probed.
const STRATEGY: &str = "planner = \"binary-levels\"\nlevels = 3";

struct Broker {
    vhost: PrivateVhost,
    config: PathBuf,
}

impl Broker {
    /// A private vhost with the strategy's topology applied.
    fn with_topology(stem: &str) -> Broker {
        let vhost = PrivateVhost::create(stem);
        let config = std::env::temp_dir().join(format!("{}.toml", unique(stem)));
        std::fs::write(&config, config_text_on(&vhost.url, STRATEGY, "")).expect("write the config");
        let broker = Broker { vhost, config };
        let applied = broker.hourglass(&["topology", "--apply"]);
        assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));
        broker
    }

    fn hourglass(&self, args: &[&str]) -> Output {
        Command::new(hourglass_binary()).args(["--config", self.config.to_str().unwrap()]).args(args).output().unwrap()
    }

    /// A policy on queues whose names match `pattern`, in this vhost only.
    fn policy(&self, pattern: &str, definition: serde_json::Value) {
        let body = serde_json::json!({ "pattern": pattern, "definition": definition, "apply-to": "queues" });
        management("PUT", &format!("/api/policies/{}/probe-breaker", encode(&self.vhost.name)), Some(body));
    }

    /// The names of the vhost's queues and exchanges that a probe declared.
    fn probe_leftovers(&self) -> Vec<String> {
        ["queues", "exchanges"]
            .iter()
            .flat_map(|kind| {
                let listed = management("GET", &format!("/api/{kind}/{}?columns=name", encode(&self.vhost.name)), None);
                listed.as_array().cloned().unwrap_or_default()
            })
            .filter_map(|object| object["name"].as_str().map(str::to_string))
            .filter(|name| name.starts_with("hourglass.probe."))
            .collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        std::fs::remove_file(&self.config).ok();
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The PROBE column of `mechanism`'s row in verify's table.
fn probe_row<'t>(table: &'t str, mechanism: &str) -> &'t str {
    table.lines().find(|line| line.split_whitespace().next() == Some(mechanism)).unwrap_or_else(|| panic!("no {mechanism} row: {table}"))
}

#[test]
fn verify_proves_every_mechanism_of_the_default_strategy_and_leaves_nothing_behind() {
    let broker = Broker::with_topology("probe-pass");
    let output = broker.hourglass(&["verify", "--format", "json"]);
    assert!(output.status.success(), "{}", text(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(report["drifts"].as_array().unwrap().is_empty(), "{report}");
    let probes: Vec<(&str, &str)> =
        report["probes"].as_array().unwrap().iter().map(|p| (p["mechanism"].as_str().unwrap(), p["outcome"].as_str().unwrap())).collect();
    assert_eq!(probes, vec![("bcc", "passed"), ("alternate-exchange", "passed"), ("at-least-once", "passed")], "{report}");
    for probe in report["probes"].as_array().unwrap() {
        // A 50 ms TTL and a few round trips; the deadline is 5 s.
        assert!(probe["elapsed_ms"].as_u64().unwrap() < 2_000, "{probe}");
    }
    let nodes = report["capacity"]["nodes"].as_array().unwrap_or_else(|| panic!("no capacity report: {report}"));
    assert!(!nodes.is_empty() && nodes[0]["fd_total"].as_u64().is_some(), "{report}");
    assert!(broker.probe_leftovers().is_empty(), "the probes deleted what they declared: {:?}", broker.probe_leftovers());

    let skipped = broker.hourglass(&["verify", "--no-probes"]);
    assert!(skipped.status.success() && text(&skipped).contains("probes skipped"), "{}", text(&skipped));
}

#[test]
fn verify_refuses_a_broker_that_dead_letters_without_the_bcc_keys() {
    let broker = Broker::with_topology("probe-bcc");
    // Dead-lettered on one fixed key instead of the message's own (BCC included), as a broker that dropped BCC keys would.
    broker.policy(r"^hourglass\.probe\.", serde_json::json!({ "dead-letter-routing-key": "elsewhere" }));
    let output = broker.hourglass(&["verify"]);
    let table = text(&output);
    assert_eq!(output.status.code(), Some(1), "{table}");
    assert!(table.contains("error: BCC keys are not carried through dead-lettering on this broker: "), "{table}");
    assert!(table.contains("hourglass's binary-levels direct routing") && table.contains("routing = \"topic\""), "{table}");
    assert!(probe_row(&table, "bcc").contains("FAILED"), "{table}");
    for unaffected in ["alternate-exchange", "at-least-once"] {
        assert!(probe_row(&table, unaffected).contains("passed"), "{table}");
    }
    assert!(broker.probe_leftovers().is_empty(), "{:?}", broker.probe_leftovers());
}

#[test]
fn verify_names_the_alternate_exchange_when_nothing_comes_through_it() {
    let broker = Broker::with_topology("probe-alternate");
    // The queue behind the probe's alternate exchange keeps nothing.
    broker.policy(r"^hourglass\.probe\..*\.alternate-exchange\.arrived$", serde_json::json!({ "max-length": 0 }));
    let output = broker.hourglass(&["verify"]);
    let table = text(&output);
    assert_eq!(output.status.code(), Some(1), "{table}");
    assert!(table.contains("error: alternate exchanges are not followed on the dead-letter path on this broker: "), "{table}");
    assert!(table.contains("nothing arrived in hourglass.probe."), "{table}");
    assert!(probe_row(&table, "alternate-exchange").contains("FAILED") && probe_row(&table, "bcc").contains("passed"), "{table}");
}

/// `serve` probes at start too: on a broker that dead-letters without the
/// BCC keys it refuses to start, naming the mechanism, instead of serving
/// messages it would deliver wrong.
#[test]
fn serve_refuses_to_start_on_a_broker_that_dead_letters_without_the_bcc_keys() {
    let broker = Broker::with_topology("probe-serve");
    broker.policy(r"^hourglass\.probe\.", serde_json::json!({ "dead-letter-routing-key": "elsewhere" }));
    let output = broker.hourglass(&["serve", "--listen", "127.0.0.1:0"]);
    let text = text(&output);
    assert!(!output.status.success(), "serve started on a broker that drops BCC keys: {text}");
    assert!(text.contains("the broker does not behave as the configured strategies need: BCC keys are not carried through dead-lettering"), "{text}");
    assert!(broker.probe_leftovers().is_empty(), "{:?}", broker.probe_leftovers());
}
