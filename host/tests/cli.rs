//! The `hourglass` binary as a user runs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn hourglass(args: &[&str]) -> Output {
    hourglass_in(&repo_root(), args)
}

fn hourglass_in(dir: &Path, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .current_dir(dir)
        .env("HOURGLASS_CACHE_DIR", cache.path())
        .env_remove("HOURGLASS_CONFIG")
        .output()
        .expect("run hourglass")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

#[test]
fn simulate_ten_seconds_waits_eight_then_two_seconds() {
    let output = hourglass(&["simulate", "--to", "destination", "--delay", "10s"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("hourglass.direct-level-03  waited 8s"), "{text}");
    assert!(text.contains("hourglass.direct-level-01  waited 2s"), "{text}");
    assert!(text.contains("delivered to destination at 10s"), "{text}");

    let messages = json(&hourglass(&["simulate", "--to", "destination", "--delay", "10s", "--format", "json"]));
    let message = &messages[0];
    assert_eq!(message["arrival_ms"], 10_000);
    let waits: Vec<(String, u64)> = message["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["via"] == "queue")
        .map(|h| (h["name"].as_str().unwrap().to_string(), h["waited_ms"].as_u64().unwrap()))
        .collect();
    assert_eq!(waits, vec![("hourglass.direct-level-03".into(), 8_000), ("hourglass.direct-level-01".into(), 2_000)]);
}

/// On NATS, `nats-hold` (examples/nats.toml, `max_wait = "1h"`): the held
/// stream delivers the message to the host, which declines it for at most an
/// hour at a time, then hands it over at its due time.
#[test]
fn simulate_on_nats_waits_in_the_held_stream_an_hour_at_a_time_then_hands_over() {
    let messages = json(&hourglass(&["--config", "examples/nats.toml", "simulate", "--to", "orders.created", "--delay", "2h30m", "--format", "json"]));
    let message = &messages[0];
    assert_eq!(message["arrival_ms"], 9_000_000, "{message}");
    let held: Vec<(u64, &str)> = message["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["via"] == "held")
        .map(|h| (h["at_ms"].as_u64().unwrap(), h["action"].as_str().unwrap()))
        .collect();
    assert_eq!(held, [(0, "wait 1h"), (3_600_000, "wait 1h"), (7_200_000, "wait 30m"), (9_000_000, "hand over")]);

    let text = stdout(&hourglass(&["--config", "examples/nats.toml", "simulate", "--to", "orders.created", "--delay", "10s"]));
    assert!(text.contains("held  hourglass-hold  waited 0s, wait 10s"), "{text}");
    assert!(text.contains("delivered to orders.created at 10s"), "{text}");

    // `plan` follows the same route: one publish to the hold subject.
    let plan = json(&hourglass(&["--config", "examples/nats.toml", "plan", "--to", "orders.created", "--delay", "10s", "--format", "json"]));
    assert_eq!((plan["commands"][0]["command"].as_str(), plan["commands"][0]["subject"].as_str()), (Some("nats-publish"), Some("hourglass.hold")), "{plan}");
    assert_eq!(plan["delivers_after_ms"], 10_000);
}

/// On NATS 2.12+, `nats-schedule`: one schedule, fired at the due time onto
/// the destination's subject; a subject no stream captures when it fires is
/// named as where the message was lost.
#[test]
fn simulate_on_nats_fires_a_schedule_at_the_due_time() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("delay.toml"), "default_strategy = \"at\"\n[broker]\nkind = \"nats\"\n[strategies.at]\nplanner = \"nats-schedule\"\n")
        .unwrap();
    let messages = json(&hourglass_in(dir.path(), &["simulate", "--to", "orders.created", "--delay", "90s", "--format", "json"]));
    let hops = messages[0]["hops"].as_array().unwrap();
    assert_eq!(messages[0]["arrival_ms"], 90_000, "{}", messages[0]);
    assert_eq!((hops[0]["via"].as_str(), hops[0]["target"].as_str(), hops[0]["waited_ms"].as_u64()), (Some("scheduled"), Some("orders.created"), Some(90_000)));
}

#[test]
fn plan_json_publishes_to_level_three_keyed_by_its_bit_with_the_rest_as_bcc() {
    let plan = json(&hourglass(&["plan", "--to", "destination", "--delay", "10s", "--format", "json"]));
    let publish = &plan["commands"][0];
    assert_eq!(publish["command"], "publish");
    assert_eq!(publish["exchange"], "hourglass.direct-level-03");
    assert_eq!(publish["routing_key"], "bit:3");
    assert_eq!(publish["bcc"], serde_json::json!(["bit:1", "to:destination"]));
    assert_eq!(publish["mandatory"], true);
}

#[test]
fn sqs_cycles_1925_seconds_is_two_cycles_then_125_seconds() {
    let messages = json(&hourglass(&["simulate", "--strategy", "sqs-long", "--to", "orders", "--delay", "1925s", "--format", "json"]));
    let message = &messages[0];
    assert_eq!(message["arrival_ms"], 1_925_000);
    let pumps: Vec<(String, String)> = message["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["via"] == "pump")
        .map(|h| (h["action"].as_str().unwrap().to_string(), h["sends"][0].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        pumps,
        vec![
            ("recycle".to_string(), "orders-delay.fifo with DelaySeconds 0".to_string()),
            ("hand over".to_string(), "orders with DelaySeconds 125".to_string()),
        ]
    );
    let plan = json(&hourglass(&["plan", "--strategy", "sqs-long", "--to", "orders", "--delay", "1925s", "--format", "json"]));
    assert_eq!(plan["commands"][0]["queue"], "orders-delay.fifo");
    // The bill: the first send, then receive + send + delete at each of the two visits.
    // Among 1,000 due together: first sends ten to a request (0.1); visit 1 receives ten,
    // re-sends them as one bundle and deletes ten (0.3); the hand-over receives ten bundles
    // of ten at a time (120 KB, billed twice: 0.02), deletes them (0.01) and sends ten to a
    // request (0.1).
    assert_eq!(plan["sqs"]["pump_visits"], 2);
    assert_eq!(plan["sqs"]["requests_alone"], 7);
    assert_eq!(plan["sqs"]["requests_in_a_busy_queue"], 0.53);
    let year = json(&hourglass(&["plan", "--strategy", "sqs-long", "--to", "orders", "--delay", "365d", "--format", "json"]));
    assert_eq!(year["sqs"]["pump_visits"], 35_039, "hand-over happens once 900 s or less remain");
}

/// `plan --rate` reads the send window and linger from the config and asks the
/// planner whether destinations share a delay queue: the docs' recipe for a
/// trickle costs a fraction of the defaults.
#[test]
fn plan_estimates_a_trickle_with_the_config_s_window_linger_and_delay_queues() {
    let dir = tempfile::tempdir().unwrap();
    let estimate = |text: &str| {
        std::fs::write(dir.path().join("delay.toml"), text).unwrap();
        let args = ["plan", "--to", "orders", "--delay", "105s", "--rate", "20", "--for", "60s", "--destinations", "10", "--format", "json"];
        json(&hourglass_in(dir.path(), &args))["sqs_stream"].clone()
    };
    let strategy = "[strategies.t]\nplanner = \"sqs-cycles\"\ncycle = \"30s\"\n";
    let defaults = estimate(&format!("default_strategy = \"t\"\n[broker]\nkind = \"sqs\"\n{strategy}"));
    let recipe = estimate(&format!(
        "default_strategy = \"t\"\n[broker]\nkind = \"sqs\"\nsend_batch_window = \"500ms\"\n[service]\npump_linger = \"2s\"\n{strategy}delay_queue = \"t-delay.fifo\"\n"
    ));
    assert_eq!((defaults["messages"].as_u64(), defaults["shared_delay_queue"].as_bool()), (Some(1_200), Some(false)), "{defaults}");
    assert_eq!(
        (recipe["shared_delay_queue"].as_bool(), recipe["send_window_ms"].as_f64(), recipe["linger_ms"].as_f64()),
        (Some(true), Some(500.0), Some(2_000.0))
    );
    let per = |estimate: &Value| estimate["requests_per_message_per_cycle"].as_f64().unwrap();
    // A queue each, 2 ms, 250 ms: about one message per request; the recipe: 0.25.
    assert!(per(&defaults) > 2.0 && per(&recipe) < 0.35, "{defaults} {recipe}");
    let output = hourglass(&["plan", "--to", "orders", "--delay", "5s", "--rate", "20"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--rate estimates SQS requests"), "{output:?}");
}

#[test]
fn changing_the_planner_in_the_config_changes_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("delay.toml");
    std::fs::write(&config, "[strategies.main]\nplanner = \"binary-levels\"\n").unwrap();
    let before = json(&hourglass_in(dir.path(), &["plan", "--to", "orders", "--delay", "5s", "--format", "json"]));
    std::fs::write(&config, "[strategies.main]\nplanner = \"hold-queues\"\n").unwrap();
    let after = json(&hourglass_in(dir.path(), &["plan", "--to", "orders", "--delay", "5s", "--format", "json"]));
    assert_eq!(before["planner"], "binary-levels");
    assert_eq!(after["planner"], "hold-queues");
    assert_eq!(after["commands"][0]["command"], "declare-queue");
    assert_eq!(after["commands"][0]["name"], "hourglass.hold.5000ms.orders");
    let simulated = json(&hourglass_in(dir.path(), &["simulate", "--to", "orders", "--delay", "5s", "--format", "json"]));
    assert_eq!(simulated[0]["hops"][1]["name"], "hourglass.hold.5000ms.orders");
}

fn config_error(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("delay.toml"), text).unwrap();
    std::fs::write(dir.path().join("not-wasm.wasm"), "hello").unwrap();
    let output = hourglass_in(dir.path(), &["plan", "--to", "orders", "--delay", "5s"]);
    assert!(!output.status.success(), "expected failure: {}", stdout(&output));
    stderr(&output)
}

#[test]
fn bad_configs_fail_with_file_line_and_column() {
    let err = config_error("[strategies.a]\nplanner = \"binary-levels\"\n[brokr]\n");
    assert!(err.contains("delay.toml:3:") && err.contains("unknown field `brokr`"), "{err}");

    let err = config_error("[strategies.a]\nplanner = \"binary-levels\"\nlevels = \"many\"\n");
    assert!(err.contains("delay.toml:3:1") && err.contains("levels: invalid type"), "{err}");

    let err = config_error("[strategies.a]\nplanner = \"binary-levels\"\nlevls = 20\n");
    assert!(err.contains("delay.toml:3:1") && err.contains("unknown field `levls`"), "{err}");

    let err = config_error("[strategies.a]\nplanner = \"missing.wasm\"\n");
    assert!(err.contains("delay.toml:2:11") && err.contains("missing.wasm") && err.contains("cannot read"), "{err}");

    let err = config_error("[strategies.a]\nplanner = \"not-wasm.wasm\"\n");
    assert!(err.contains("delay.toml:2:11") && err.contains("not-wasm.wasm") && err.contains("not a WebAssembly component"), "{err}");

    let err = config_error("[planners]\ncall_timeout = 5\nmemory_limit_mib = true\n[strategies.a]\nplanner = \"hold-queues\"\n");
    assert!(err.contains("delay.toml:3:"), "{err}");
}

/// `inspect` reads what waits on the broker without a service: where it
/// cannot, it names the kinds that can, from what each kind says it can do.
#[test]
fn inspect_where_nothing_waits_at_rest_names_the_kinds_that_can() {
    let output = hourglass(&["inspect"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("inspect needs broker.kind = \"rabbitmq\" or \"nats\""), "{}", stderr(&output));
}

#[test]
fn a_missing_config_file_is_named() {
    let output = hourglass(&["--config", "/nonexistent/delay.toml", "plan", "--to", "x", "--delay", "1s"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("/nonexistent/delay.toml: cannot read the config"), "{}", stderr(&output));
}

#[test]
fn bad_durations_and_refused_delays_exit_non_zero() {
    let output = hourglass(&["plan", "--to", "x", "--delay", "soon"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("duration \"soon\""), "{}", stderr(&output));
    let output = hourglass(&["plan", "--strategy", "retries", "--to", "x", "--delay", "2h"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("planner fixed-intervals refused: delay 7200000ms is above the longest interval"), "{}", stderr(&output));
}

#[test]
fn check_planner_passes_for_the_built_ins_and_the_example() {
    let dir = tempfile::tempdir().unwrap();
    let intervals = dir.path().join("intervals.toml");
    std::fs::write(&intervals, "intervals = [\"1s\", \"10s\", \"1m\"]\n").unwrap();
    // Sub-levels below the unit: every delay is checked to arrive at its promise, to the 125 ms step.
    let precise = dir.path().join("precise.toml");
    std::fs::write(&precise, "precision = \"125ms\"\n").unwrap();
    let example = common::test_planner("backoff-planner");
    let runs: Vec<Vec<&str>> = vec![
        vec!["check-planner", "binary-levels"],
        vec!["check-planner", "binary-levels", "--planner-config", precise.to_str().unwrap()],
        vec!["check-planner", "hold-queues"],
        vec!["check-planner", "fixed-intervals", "--planner-config", intervals.to_str().unwrap()],
        vec!["check-planner", "sqs-cycles", "--horizon", "1d", "--samples", "50"],
        vec!["check-planner", "nats-hold", "--horizon", "1d", "--samples", "50"],
        vec!["check-planner", "nats-schedule", "--horizon", "1d", "--samples", "50"],
        vec!["check-planner", example.to_str().unwrap()],
    ];
    for args in runs {
        let output = hourglass(&args);
        assert!(output.status.success(), "{args:?}: {}{}", stdout(&output), stderr(&output));
        assert!(stdout(&output).contains("delivered as promised"), "{}", stdout(&output));
    }
}

#[test]
fn check_planner_catches_a_wrong_planner() {
    let wrong = common::test_planner("off-by-one");
    let output = hourglass(&["check-planner", wrong.to_str().unwrap()]);
    assert!(!output.status.success());
    let text = stdout(&output);
    assert!(text.contains("broken promises"), "{text}");
    let line = text.lines().find(|l| l.starts_with("on-time ") && l.contains(" 1024ms ")).unwrap_or_else(|| panic!("no 1024ms row: {text}"));
    assert!(line.contains("arrival after 1024ms") && line.contains("arrived after 1023ms"), "{line}");
}

/// Each broken promise beyond lateness is caught and named in the JSON report:
/// a second copy, a copy left behind, a plan that changes between calls.
#[test]
fn check_planner_reports_duplicates_leftovers_and_changing_plans_as_json() {
    let wrong = common::test_planner("off-by-one");
    let dir = tempfile::tempdir().unwrap();
    for (fault, property, got) in [
        ("twice", "one-delivery", "a second copy arrived"),
        ("copy-left", "one-delivery", "off-by-one.forgotten"),
        ("changing", "deterministic", "off-by-one."),
    ] {
        let config = dir.path().join(format!("{fault}.toml"));
        std::fs::write(&config, format!("fault = \"{fault}\"\n")).unwrap();
        let args = ["check-planner", wrong.to_str().unwrap(), "--planner-config", config.to_str().unwrap(), "--samples", "5", "--format", "json"];
        let output = hourglass(&args);
        assert!(!output.status.success(), "{fault}: {}", stdout(&output));
        let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
        let failures = report["failures"].as_array().unwrap();
        assert!(!failures.is_empty(), "{fault}: {report}");
        for failure in failures {
            assert_eq!(failure["property"], property, "{fault}: {failure}");
            assert!(failure["got"].as_str().unwrap().contains(got), "{fault}: {failure}");
        }
        // Every delay it accepts breaks the promise, one failure each; the one
        // probe beyond its maximum is refused, as it should be.
        assert_eq!(failures.len() as u64 + 1, report["checked"].as_u64().unwrap(), "{fault}: {report}");
        assert_eq!(report["properties"].as_array().unwrap().len(), 5, "{report}");
    }
}

#[test]
fn topology_renders_as_mermaid_and_dot() {
    let mermaid = stdout(&hourglass(&["topology", "--format", "mermaid", "--to", "orders"]));
    assert!(mermaid.starts_with("graph TD"), "{mermaid}");
    assert!(mermaid.contains("TTL 4years 3months"), "{mermaid}");
    let dot = stdout(&hourglass(&["topology", "--format", "dot"]));
    assert!(dot.starts_with("digraph topology {") && dot.trim_end().ends_with('}'), "{dot}");
    let table = json(&hourglass(&["topology", "--format", "json"]));
    let parking = 3; // exchange, queue, binding
    assert_eq!(table.as_array().unwrap().len(), parking + 1 + 28 * 5, "parking, delivery exchange, 28 levels of two exchanges, a queue and two bindings");
    assert!(mermaid.contains(r#"-->|"unrouted"|"#), "each level's alternate exchange is drawn: {mermaid}");
}

#[test]
fn the_example_planner_config_works_as_is() {
    // Where the example's config expects it, from a target/ in the repository (its comment gives the command).
    common::test_planner("backoff-planner");
    let messages = json(&hourglass(&["--config", "examples/backoff.toml", "simulate", "--to", "orders", "--delay", "3s", "--format", "json"]));
    assert_eq!(messages[0]["arrival_ms"], 4_000, "3 s rounds up to the 4 s bucket");
    assert_eq!(messages[0]["hops"][1]["name"], "backoff.4000ms");
}

/// The migration guide's whole `delay.toml`, with its delayed exchange,
/// loads as copied.
#[test]
fn the_migration_guide_configuration_loads_as_copied() {
    let guide = std::fs::read_to_string(repo_root().join("docs/migrating-from-the-delayed-message-plugin.md")).unwrap();
    let block =
        guide.split("```toml\n").skip(1).filter_map(|b| b.split("```").next()).find(|b| b.contains("[broker]")).expect("a whole delay.toml in the guide");
    assert!(block.contains("[exchanges.\"orders.delayed\"]"), "{block}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("delay.toml"), block).unwrap();
    let output = hourglass_in(dir.path(), &["--config", "delay.toml", "strategies"]);
    assert!(output.status.success(), "the guide's delay.toml does not load: {}", stderr(&output));
}

/// How long after its due time the memory broker's delivery line may be read
/// from `serve`'s stderr. Measured here: 2-3 ms (debug build, 2 cores, five
/// runs beside the SQS bench); the window leaves room for a busier CI run.
const MEMORY_LOG_WINDOW_MS: u64 = 100;

/// The README's first minutes: `serve` on the default memory broker takes a
/// message, logs its delivery when it falls due (no one asking), keeps it for
/// `GET /v1/delivered`, and stops cleanly on SIGTERM.
#[test]
fn serve_on_the_default_config_shows_a_delay_happen_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let cache = tempfile::tempdir().unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(repo_root())
        .env("HOURGLASS_CACHE_DIR", cache.path())
        .env_remove("HOURGLASS_TOKEN")
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    // The first line names the bound address (port 0 → a free one); read_line waits for it.
    stderr.read_line(&mut line).unwrap();
    let address = line.split("http://").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap_or_else(|| panic!("no address in {line:?}")).to_string();
    assert!(line.contains("in-memory broker"), "{line}");
    let (lines_tx, lines) = std::sync::mpsc::channel::<(u64, String)>();
    let reader = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines_tx.send((hourglass::clock::unix_now_ms(), line));
        }
    });

    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut response =
        agent.post(&format!("http://{address}/v1/messages")).send_json(serde_json::json!({ "destination": "orders", "delay": "1s", "body": "hi" })).unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let accepted: Value = response.body_mut().read_json().unwrap();
    let (id, due_at) = (accepted["id"].as_str().unwrap().to_string(), accepted["due_at"].as_u64().unwrap());

    let deadline = Instant::now() + Duration::from_secs(10);
    let (logged_at, logged) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (at, line) = lines.recv_timeout(left).unwrap_or_else(|_| panic!("no delivery of {id} logged within 10 s"));
        if line.contains("delivered") && line.contains(&id) {
            break (at, line);
        }
    };
    assert!(logged.contains("destination=orders") && logged.contains("late_ms="), "{logged}");
    assert!(logged_at >= due_at, "logged {} ms before the due time", due_at - logged_at);
    eprintln!("delivery logged {} ms after its due time", logged_at - due_at);
    assert!(logged_at <= due_at + MEMORY_LOG_WINDOW_MS, "logged {} ms after the due time (window {MEMORY_LOG_WINDOW_MS} ms)", logged_at - due_at);

    let mut response = agent.get(&format!("http://{address}/v1/delivered?destination=orders")).call().unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let delivered: Value = response.body_mut().read_json().unwrap();
    let message = &delivered["messages"][0];
    assert_eq!((message["id"].as_str(), message["body"].as_str()), (Some(id.as_str()), Some("hi")), "{delivered}");
    assert!(message["late_ms"].as_i64().is_some_and(|late| late >= 0), "{delivered}");
    let response = agent.get(&format!("http://{address}/v1/delivered")).call().unwrap();
    assert_eq!(response.status().as_u16(), 400, "the destination is required");

    Command::new("kill").args(["-TERM", &server.id().to_string()]).status().unwrap();
    let status = server.wait().unwrap();
    assert!(status.success(), "serve exits 0 on SIGTERM: {status:?}");
    reader.join().unwrap();
    let rest: Vec<String> = lines.try_iter().map(|(_, line)| line).collect();
    assert!(rest.iter().any(|line| line.contains("hourglass stopped")), "{rest:?}");
}

#[test]
fn topology_apply_reports_each_destination_and_refuses_hourglass_own_queues() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("delay.toml"), "[broker]\nkind = \"memory\"\n\n[strategies.main]\nplanner = \"binary-levels\"\n").unwrap();
    let output = hourglass_in(dir.path(), &["topology", "--apply", "--to", "orders", "--to", "hourglass.direct-level-01", "--to", "invoices"]);
    // Not a terminal here: one plain line per destination, then the summary on stdout.
    let progress = stderr(&output);
    assert!(progress.contains("[1/3] orders: prepared"), "{progress}");
    assert!(progress.contains("[2/3] hourglass.direct-level-01: FAILED"), "{progress}");
    assert!(progress.contains("[3/3] invoices: prepared"), "{progress}");
    assert!(progress.contains("one of hourglass's own queues or exchanges"), "{progress}");
    assert!(stdout(&output).contains("prepared 2 of 3 destinations"), "{}", stdout(&output));
    assert!(!output.status.success(), "a destination that failed fails the command");
}
