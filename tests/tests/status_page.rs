//! The status page at `/`, loaded by a real browser (Debian's Chromium,
//! headless, which `scripts/test` installs): it renders the strategies with
//! the messages waiting on a real RabbitMQ and the canary's lateness, and
//! tells the browser to reload itself.

use std::process::Command;
use std::time::Duration;

use hourglass::service::Service;
use hourglass_e2e::serve::Served;
use hourglass_e2e::*;
use serde_json::{Value, json};

fn browser() -> String {
    std::env::var("HOURGLASS_TEST_BROWSER").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// The page's DOM after Chromium loaded and parsed it.
fn rendered(url: &str) -> String {
    let browser = browser();
    let profile = std::env::temp_dir().join(unique("chromium-profile"));
    let output = Command::new(&browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--timeout=10000"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", url])
        .output()
        .unwrap_or_else(|e| panic!("{browser} could not run ({e}): install Debian's chromium (apt-get install chromium); scripts/test does"));
    std::fs::remove_dir_all(&profile).ok();
    assert!(output.status.success(), "{browser}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The text of the first element after `marker` (a cell's contents).
fn cell_after<'a>(dom: &'a str, marker: &str) -> &'a str {
    let rest = &dom[dom.find(marker).unwrap_or_else(|| panic!("{marker} not in the page: {dom}")) + marker.len()..];
    let start = rest.find('>').unwrap() + 1;
    &rest[start..start + rest[start..].find('<').unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_shows_waiting_messages_and_lateness_per_strategy() {
    let (prefix, canary_queue) = (unique("status"), unique("status-canary"));
    let config = config_with(
        &format!("planner = \"binary-levels\"\nprefix = \"{prefix}\""),
        &format!("[service.canary]\nqueue = \"{canary_queue}\"\nevery = \"300ms\"\ndelay = \"1s\""),
    );
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topology_of(&config));
    cleanup.queue(&canary_queue);
    let connection = connect().await;
    let destination = Destination::declare(&connection, "status").await;
    cleanup.queue(&destination.name);
    let served = Served::start(Service::start(config.clone()).await.expect("service starts")).await;
    const WAITING: u64 = 3;
    for _ in 0..WAITING {
        let (status, answer) = served.http.schedule(None, json!({ "destination": destination.name, "delay": "90s", "body": "later" })).await;
        assert_eq!(status, 202, "{answer}");
    }
    until("the depths read and two probes timed", Duration::from_secs(20), async || {
        let (_, text) = served.http.call("GET", "/v1/delays", None, None).await;
        let delays: Value = serde_json::from_str(&text).unwrap();
        let probes = served.http.metric("hourglass_delivery_lateness_seconds_count{strategy=\"main\"}").await;
        // The canary's own probes wait in the same levels: at least ours.
        delays["strategies"][0]["waiting"].as_u64().is_some_and(|n| n >= WAITING) && probes >= 2.0
    })
    .await;

    let url = format!("{}/", served.http.base);
    let dom = tokio::task::spawn_blocking(move || rendered(&url)).await.unwrap();
    assert!(dom.contains("<h1>hourglass</h1>"), "{dom}");
    assert!(dom.contains("http-equiv=\"refresh\""), "the page reloads itself: {dom}");
    let row = "<tr data-strategy=\"main\">";
    assert!(dom.contains(row), "{dom}");
    let strategy_row = &dom[dom.find(row).unwrap()..];
    let waiting: u64 = cell_after(strategy_row, "class=\"waiting\"").trim().parse().unwrap_or_else(|_| panic!("a count: {strategy_row}"));
    assert!(waiting >= WAITING, "the messages waiting (and the canary's probes): {strategy_row}");
    assert_eq!(cell_after(strategy_row, "class=\"parked\"").trim(), "0", "{strategy_row}");
    assert!(!strategy_row[..strategy_row.find("</tr>").unwrap()].contains("<td>–</td>"), "lateness percentiles are shown: {strategy_row}");
    assert!(dom.contains(&format!("{prefix}.direct-level-")), "the waiting levels are listed: {dom}");
    assert!(dom.contains("graph TD"), "the topology's mermaid text is shown: {dom}");
    // The browser parsed the drawing as SVG: the level queues are nodes of it.
    let drawing = &dom[dom.find("<svg").expect("the topology is drawn")..];
    let drawing = &drawing[..drawing.find("</svg>").unwrap()];
    assert!(drawing.matches("<rect").count() >= 28 && drawing.contains(&format!("queue {prefix}.direct-level-27")), "{drawing}");

    served.stop().await;
}
