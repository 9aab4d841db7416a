//! The example RabbitMQ configs work as is, through the `hourglass` binary;
//! the example redelivery consumer (Python, pika) works against them.

use std::process::Command;
use std::time::Duration;

use hourglass_e2e::process::ServeProcess;
use hourglass_e2e::vhost::PrivateVhost;
use hourglass_e2e::*;

#[tokio::test]
async fn examples_rabbitmq_toml_schedules_and_verifies_as_is() {
    // The example declares fixed names (prefix "hourglass"): it runs in a vhost of its own.
    let vhost = PrivateVhost::create("examples");
    let connection = connect_to(&vhost.url).await;
    let mut destination = Destination::declare(&connection, "example").await;
    let run = |args: &[&str]| {
        Command::new(hourglass_binary())
            .current_dir(repo_root())
            .args(["--config", "examples/rabbitmq.toml"])
            .args(args)
            .env("HOURGLASS_AMQP_URL", &vhost.url)
            // As a user whose broker's management API is not on the AMQP host's port 15672 would.
            .env("HOURGLASS_MANAGEMENT_URL", management_url())
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        let applied = run(&["topology", "--apply", "--to", &destination.name]);
        assert!(applied.status.success(), "topology --apply is idempotent: {}", String::from_utf8_lossy(&applied.stderr));
        assert!(String::from_utf8_lossy(&applied.stdout).contains("applied the topology of strategy seconds on RabbitMQ"));
    }
    let output = run(&["schedule", "--to", &destination.name, "--delay", "1s", "--body", "hello", "--header", "tenant=acme", "--format", "json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let scheduled: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let received = destination.receive(1, Duration::from_secs(5)).await;
    assert_eq!(received[0].delivery.data, b"hello");
    assert_eq!(received[0].delivery.properties.message_id().as_ref().map(|m| m.to_string()), scheduled["id"].as_str().map(str::to_string));
    assert!(received[0].at_ms >= scheduled["due_at_ms"].as_u64().unwrap());

    let verified = run(&["verify", "--to", &destination.name]);
    assert!(verified.status.success(), "{}{}", String::from_utf8_lossy(&verified.stdout), String::from_utf8_lossy(&verified.stderr));
    assert!(String::from_utf8_lossy(&verified.stdout).contains("no drift"));

    let missing = run(&["schedule", "--to", &unique("absent"), "--delay", "1s", "--body", "x"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"), "{}", String::from_utf8_lossy(&missing.stderr));

    destination.delete().await;
    connection.close(200, "done".into()).await.ok();
    drop(vhost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_redelivery_toml_with_its_python_consumer_retries_twice_then_succeeds() {
    let python = std::env::var("HOURGLASS_TEST_PYTHON")
        .unwrap_or_else(|_| panic!("HOURGLASS_TEST_PYTHON is not set: run the tests with scripts/test, which installs pika into a venv for this test"));
    // The example's names are fixed ("work", "hourglass.redelivery"): it runs in a vhost of its own.
    let vhost = PrivateVhost::create("examples-redelivery");
    let config = repo_root().join("examples/redelivery.toml");
    let mut serve = ServeProcess::start_on(&config, &vhost.url);
    until("the example service ready", Duration::from_secs(20), async || serve.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let consumer = repo_root().join("examples/redelivery_consumer.py");
    let url = vhost.url.clone();
    let output =
        tokio::task::spawn_blocking(move || Command::new(python).arg(consumer).args(["--url", &url, "--timeout", "60"]).output().unwrap()).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let attempts: Vec<&str> = stdout.lines().filter(|l| l.starts_with("job-1 attempt")).collect();
    assert_eq!(attempts.len(), 3, "{stdout}");
    assert!(attempts[0].starts_with("job-1 attempt 1 ") && attempts[0].ends_with("failing (reject)"), "{stdout}");
    assert!(attempts[1].starts_with("job-1 attempt 2 ") && attempts[1].ends_with("failing (reject)"), "{stdout}");
    assert!(attempts[2].starts_with("job-1 attempt 3 ") && attempts[2].ends_with("succeeded"), "{stdout}");
    let seconds: f64 = attempts[2].split(" at ").nth(1).and_then(|t| t.split(' ').next()).and_then(|t| t.parse().ok()).unwrap();
    assert!(seconds >= 7.0, "the third attempt came after {seconds} s; the intervals are 2 s then 5 s");

    let base = serve.http.base.clone();
    let status = Command::new(hourglass_binary()).args(["--config", config.to_str().unwrap(), "redelivery", "status", "--url", &base]).output().unwrap();
    let table = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let row: Vec<&str> = table.lines().find(|l| l.starts_with("work ")).unwrap_or_else(|| panic!("no row for work: {table}")).split_whitespace().collect();
    assert_eq!(&row[..4], &["work", "0", "2", "0"], "queue, waiting, redelivered, given up: {table}");

    serve.signal("TERM");
    assert!(serve.wait(Duration::from_secs(30)).success());
    drop(vhost);
}

/// How late the delayed-exchange example's orders may reach its consumer, as
/// the consumer measures it (send time plus `x-delay` on the producer's clock,
/// receive time on its own, both Python processes on this machine):
/// measured 85–115 ms (two tests at a time, 2026-12-02; printed). 1 s levels,
/// whole-second delays: a hop off would be 1,000 ms.
const EXAMPLE_ON_TIME_MS: i64 = 400;

/// examples/delayed-exchange: a pika producer and consumer written for the
/// delayed-message plugin (publish to `orders.delayed` with `x-delay`;
/// queues bound with `order.*`, `order.created`, `#`) work against the
/// example config with only their exchange declarations changed. Each order
/// reaches every queue whose binding matches, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_delayed_exchange_with_its_pika_producer_and_consumer_fans_out_on_time() {
    use std::io::{BufRead, BufReader};
    let python = std::env::var("HOURGLASS_TEST_PYTHON")
        .unwrap_or_else(|_| panic!("HOURGLASS_TEST_PYTHON is not set: run the tests with scripts/test, which installs pika into a venv for this test"));
    // The example's names are fixed ("orders", "orders.delayed", "hourglass.ingress"): it runs in a vhost of its own.
    let vhost = PrivateVhost::create("examples-delayed");
    let dir = repo_root().join("examples/delayed-exchange");
    let serve = ServeProcess::start_on(&dir.join("hourglass.toml"), &vhost.url);
    until("the example service ready", Duration::from_secs(20), async || serve.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let url = vhost.url.clone();
    let (consumer_py, producer_py) = (dir.join("consumer.py"), dir.join("producer.py"));
    let (stdout, produced) = tokio::task::spawn_blocking(move || {
        let mut consumer = Command::new(&python)
            .arg(consumer_py)
            .args(["--url", &url, "--timeout", "30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the example consumer");
        let mut lines = BufReader::new(consumer.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(first, "ready", "the consumer binds its queues before the producer publishes");
        let produced = Command::new(&python).arg(producer_py).args(["--url", &url]).output().unwrap();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = consumer.wait().unwrap();
        (format!("{}\nexit: {status}", rest.join("\n")), produced)
    })
    .await
    .unwrap();
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
    assert!(stdout.contains("received 6 of 6, 0 early") && stdout.ends_with("exit: exit status: 0"), "{stdout}");
    let mut got: Vec<&str> = stdout.lines().filter(|l| l.contains(" got ")).map(|l| l.split(" late_ms=").next().unwrap()).collect();
    got.sort();
    // The consumer's own reading: its receive time minus the producer's send time plus x-delay.
    let late: Vec<i64> =
        stdout.lines().filter_map(|l| l.split(" late_ms=").nth(1)).map(|n| n.trim().parse().unwrap_or_else(|_| panic!("late_ms in {l:?}", l = n))).collect();
    eprintln!("delayed-exchange example: late_ms {late:?} (window {EXAMPLE_ON_TIME_MS} ms)");
    assert!(late.len() == 6 && late.iter().all(|&l| l <= EXAMPLE_ON_TIME_MS), "lateness {late:?} ms, window {EXAMPLE_ON_TIME_MS} ms: {stdout}");
    assert_eq!(
        got,
        [
            "# got invoice.paid",
            "# got order.created",
            "# got order.shipped",
            "order.* got order.created",
            "order.* got order.shipped",
            "order.created got order.created"
        ],
        "{stdout}"
    );
    drop(serve);
    drop(vhost);
}

/// How late the NATS example's messages may reach its Python consumer, as the
/// consumer measures it (its clock when a message arrives minus the message's
/// `hourglass-due-at`, both on this machine): measured 3–19 ms (20 messages a
/// run, 2026-12-02: five runs on nats-server 2.9.10, two of them beside the
/// 3,000-message NATS test, and three on 2.15.1; printed). The host answers
/// declines on a 100 ms grid, so a message may come up to a grid step after
/// its wait; the window is tests/tests/nats.rs's, which allows for a loaded machine.
const NATS_EXAMPLE_ON_TIME_MS: i64 = 250;

/// examples/nats.toml, as `hourglass serve` on the NATS server under test
/// (`HOURGLASS_NATS_URL`, as a user overrides its `url`), with
/// examples/nats-python: the consumer creates the destination's stream, the
/// producer publishes to the ingress subject with `hourglass-destination` and
/// `hourglass-delay`, and every message arrives, none early, its other headers
/// with it. The example's names are fixed ("hourglass-hold",
/// "hourglass.ingress", …) and a NATS server has no vhosts: every quoted name
/// starting with `hourglass` gets a prefix of this run's own, and the test
/// checks that this covers every stream and subject the config makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_nats_toml_with_its_python_producer_and_consumer_delivers_on_time_on_nats() {
    use hourglass::command::{Command as BrokerCommand, NatsCommand};
    use hourglass_e2e::nats::{delete_streams, nats_url};
    use std::io::{BufRead, BufReader};
    let python = std::env::var("HOURGLASS_TEST_PYTHON")
        .unwrap_or_else(|_| panic!("HOURGLASS_TEST_PYTHON is not set: run the tests with scripts/test, which installs nats-py into a venv for this test"));
    let prefix = format!("{}-", unique("example"));
    let text = std::fs::read_to_string(repo_root().join("examples/nats.toml"))
        .unwrap()
        .replace("\"hourglass-", &format!("\"{prefix}hourglass-"))
        .replace("\"hourglass.", &format!("\"{prefix}hourglass."));
    let path = std::env::temp_dir().join(format!("{prefix}nats.toml"));
    std::fs::write(&path, &text).unwrap();

    // Every stream and subject the config makes is this run's own.
    let config = hourglass::config::Config::parse(&path, text.clone()).expect("examples/nats.toml parses");
    let names: Vec<&str> = config.strategies.keys().map(String::as_str).collect();
    let mut streams = Vec::new();
    for command in topologies_of(&config, &names) {
        if let BrokerCommand::Nats(NatsCommand::EnsureStream { name, subjects, held }) = command {
            assert!(name.starts_with(&prefix) && subjects.iter().all(|s| s.starts_with(&prefix)), "stream {name} ({subjects:?}) is not this run's own");
            if held {
                streams.push(format!("{name}-parked"));
            }
            streams.push(name);
        }
    }
    assert!(!streams.is_empty(), "the example's strategies hold messages in streams");
    let (ingress, canary) = (&config.service.ingress, &config.service.canary);
    for subject in [&ingress.queue, &ingress.invalid_queue, &canary.queue] {
        assert!(subject.starts_with(&prefix), "subject {subject} is not this run's own");
        streams.push(subject.replace('.', "-"));
    }
    assert!(ingress.enabled, "the example's ingress is on");
    let hourglass::config::broker::BrokerSettings::Nats(settings) = config.broker.settings() else { panic!("a NATS config") };
    let clock_stream = settings.clock_stream;
    assert!(clock_stream.starts_with(&prefix), "the clock stream {clock_stream} is not this run's own");
    streams.push(clock_stream);
    let destination = format!("{}.orders", prefix.trim_end_matches('-'));
    streams.push(destination.replace('.', "-"));

    let url = nats_url();
    let mut serve = ServeProcess::start_with_env(&path, &[("HOURGLASS_NATS_URL", &url)]);
    until("the example service ready", Duration::from_secs(20), async || serve.http.call("GET", "/readyz", None, None).await.0 == 200).await;

    let examples = repo_root().join("examples/nats-python");
    let (consumer_py, producer_py) = (examples.join("consumer.py"), examples.join("producer.py"));
    let (ingress_subject, target) = (ingress.queue.clone(), destination.clone());
    let (stdout, produced) = tokio::task::spawn_blocking(move || {
        let mut consumer = Command::new(&python)
            .arg(consumer_py)
            .args(["--url", &url, "--subject", &target, "--count", "20", "--timeout", "30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the example consumer");
        let mut lines = BufReader::new(consumer.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(first, "ready", "the consumer creates the destination's stream before the producer publishes");
        let produced = Command::new(&python)
            .arg(producer_py)
            .args(["--url", &url, "--ingress", &ingress_subject, "--subject", &target, "--count", "20", "--delay", "2s", "--step", "100ms"])
            .output()
            .unwrap();
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = consumer.wait().unwrap();
        (format!("{}\nexit: {status}", rest.join("\n")), produced)
    })
    .await
    .unwrap();
    serve.signal("TERM");
    let stopped = serve.wait(Duration::from_secs(30));
    delete_streams(&streams).await;
    std::fs::remove_file(&path).ok();

    assert!(produced.status.success(), "{}{}", String::from_utf8_lossy(&produced.stdout), String::from_utf8_lossy(&produced.stderr));
    assert!(stdout.contains("received 20 of 20, 0 early") && stdout.ends_with("exit: exit status: 0"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.contains(" tenant=acme ")).count(), 20, "the producer's headers travel on: {stdout}");
    let late: Vec<i64> =
        stdout.lines().filter_map(|l| l.split(" late_ms=").nth(1)).map(|n| n.trim().parse().unwrap_or_else(|_| panic!("late_ms in {n:?}"))).collect();
    eprintln!("NATS example: late_ms {late:?} (window {NATS_EXAMPLE_ON_TIME_MS} ms)");
    assert!(late.len() == 20 && late.iter().all(|&l| (0..=NATS_EXAMPLE_ON_TIME_MS).contains(&l)), "lateness {late:?} ms, window {NATS_EXAMPLE_ON_TIME_MS} ms");
    assert!(stopped.success(), "hourglass serve stops on SIGTERM: {:#?}", serve.log());
}
