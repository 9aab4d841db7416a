//! The status page at `/`: one server-rendered HTML page, without script,
//! that reloads itself every few seconds. Per strategy: its planner, messages
//! waiting and parked (the last [`pending`](super::pending) reading), the
//! canary's lateness percentiles, and its topology drawn (an inline SVG) with the `mermaid` text
//! `GET /v1/topology?format=mermaid` serves; above them the totals `/metrics`
//! counts (scheduled, failed, invalid, early) and what is down.

use std::fmt::Write;

use super::Service;
use crate::render;

/// Seconds between the page's own reloads.
pub(crate) const REFRESH_SECONDS: u32 = 5;

/// The page, as it stands now.
pub async fn page(service: &Service) -> String {
    let readiness = service.readiness().await;
    let metrics = &service.metrics;
    let pending = service.pending();
    let scheduler = &service.scheduler;
    let default = scheduler.default_strategy();

    let mut html = String::new();
    let _ = write!(
        html,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
         <title>hourglass</title><style>{STYLE}</style></head><body>\n<h1>hourglass</h1>\n"
    );
    let state = if readiness.ready { "ready".to_string() } else { format!("NOT READY: {}", down_list(&readiness)) };
    let _ = writeln!(html, "<p id=\"state\" class=\"{}\">{}</p>", if readiness.ready { "ok" } else { "bad" }, escape(&state));
    let early = metrics.early_total();
    let _ = writeln!(html, "<table id=\"totals\"><tr><th>scheduled</th><th>failed</th><th>invalid (ingress)</th><th>early</th></tr>");
    let _ = writeln!(
        html,
        "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr></table>",
        metrics.scheduled_total(),
        metrics.failed_total(),
        metrics.ingress_count("invalid"),
        if early == 0 { "ok" } else { "bad" },
        early,
    );

    let _ = writeln!(
        html,
        "<h2>Strategies</h2>\n<table id=\"strategies\"><tr><th>strategy</th><th>waiting</th><th>parked</th><th>lateness p50</th><th>lateness p99</th><th>probes</th></tr>"
    );
    for strategy in scheduler.strategy_names() {
        let depths = pending.iter().find(|p| p.strategy == strategy);
        let count = |n: Option<u64>| n.map_or("–".to_string(), |n| n.to_string());
        let (p50, p99, probes) = match metrics.recent_lateness(&strategy) {
            Some((p50, p99, n)) => (render::duration(p50), render::duration(p99), n.to_string()),
            None => ("–".into(), "–".into(), "0".into()),
        };
        let marker = if strategy == default { " (default)" } else { "" };
        let _ = writeln!(
            html,
            "<tr data-strategy=\"{name}\"><td>{name}{marker}</td><td class=\"waiting\">{}</td><td class=\"parked\">{}</td><td>{p50}</td><td>{p99}</td><td>{probes}</td></tr>",
            count(depths.map(|d| d.waiting)),
            count(depths.map(|d| d.parked)),
            name = escape(&strategy),
        );
    }
    let _ = writeln!(html, "</table>");

    let _ = writeln!(html, "<h2>Waiting, per queue</h2>\n<table id=\"levels\"><tr><th>strategy</th><th>queue</th><th>messages</th><th>TTL</th></tr>");
    for strategy in &pending {
        for queue in strategy.queues.iter().filter(|q| q.messages.is_some_and(|m| m > 0)) {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&strategy.strategy),
                escape(&queue.queue),
                queue.messages.unwrap_or(0),
                queue.ttl_ms.map_or(String::new(), render::duration)
            );
        }
    }
    let _ = writeln!(html, "</table>");

    let _ = writeln!(html, "<h2>Topology</h2>");
    for strategy in scheduler.strategy_names() {
        if let Ok(commands) = scheduler.topology_of(&strategy) {
            let _ = writeln!(
                html,
                "<details><summary>{}</summary>\n{}<details><summary>as mermaid</summary><pre class=\"mermaid\">{}</pre></details></details>",
                escape(&strategy),
                render::svg(&commands),
                escape(&render::mermaid(&commands))
            );
        }
    }
    let _ = writeln!(
        html,
        "<p class=\"note\">Reloads every {REFRESH_SECONDS} s. Queue depths are the last reading (service.depth_poll); lateness is the canary's newest probes.</p>\n</body></html>"
    );
    html
}

fn down_list(readiness: &super::Readiness) -> String {
    let mut parts: Vec<String> = readiness.down.iter().map(|d| format!("{} ({})", d.task, d.reason)).collect();
    if !readiness.broker {
        parts.insert(0, "not connected to the broker (or it blocked publishing)".into());
    }
    parts.join("; ")
}

/// Text as HTML: names come from the config and the broker.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem;color:#222}table{border-collapse:collapse;margin:.5rem 0 1.5rem}\
th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:left}th{background:#f4f4f4}.ok{color:#17692b}.bad{color:#b00020;font-weight:bold}\
pre{background:#f8f8f8;padding:.5rem;overflow:auto}.note{color:#666;font-size:.9rem}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::executor::Broker;
    use crate::executor::testing::Accepting;
    use crate::scheduler::Scheduler;
    use crate::scheduler::strategies::Strategies;

    #[tokio::test]
    async fn the_totals_are_what_was_counted() {
        let text = "[planners]\ncache = false\n[strategies.main]\nplanner = \"hold-queues\"\n[destinations.orders]\n";
        let config = Config::parse(std::path::Path::new("status.toml"), text.into()).unwrap();
        let broker = Broker::new(std::sync::Arc::new(Accepting));
        let service = Service::new(Scheduler::new(&config, Strategies::load(&config).unwrap(), broker), None);
        let metrics = &service.metrics;
        for (strategy, destination) in [("main", "orders"), ("main", "orders"), ("main", "not-configured"), ("not-configured", "orders")] {
            metrics.scheduled(strategy, destination);
        }
        metrics.failed("main", "orders");
        for outcome in ["invalid", "invalid", "forwarded", "requeued"] {
            metrics.ingress(outcome);
        }
        metrics.delivered_early("main");
        // A reload that drops `main` and `orders`: what they counted still counts.
        metrics.bound_labels([&"next".to_string()], []);
        metrics.scheduled("next", "orders");
        metrics.failed("main", "orders");

        let html = page(&service).await;
        let totals = "<tr><td>5</td><td>2</td><td>2</td><td class=\"bad\">1</td></tr></table>";
        assert!(html.contains(totals), "scheduled 5, failed 2, invalid 2, early 1: {html}");
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
