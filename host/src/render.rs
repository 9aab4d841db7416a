//! Human and machine output: tables, JSON, Mermaid and DOT.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::command::{AmqpCommand, Command, DeclaredObject, Described, FieldTable, ObjectKind};
use crate::sim::simulation::SimulatedMessage;
use crate::sim::{Hop, HopStep};

pub fn duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// A plain text table with aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn arguments(table: &FieldTable) -> String {
    table.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

/// One line per command: what it does and to what.
pub fn commands(commands: &[Command]) -> String {
    let rows: Vec<Vec<String>> = commands
        .iter()
        .enumerate()
        .map(|(i, command)| {
            let Described { what, name, details } = command.describe();
            vec![(i + 1).to_string(), what.to_string(), name, details]
        })
        .collect();
    table(&["#", "COMMAND", "NAME", "DETAILS"], &rows)
}

fn strip_kind(label: &str) -> String {
    label.replace(':', " ")
}

/// A routing key and the `BCC` keys routed on with it.
fn keys(routing_key: &str, bcc: &[String]) -> String {
    if bcc.is_empty() { routing_key.to_string() } else { format!("{routing_key} +bcc {}", bcc.join(",")) }
}

/// The route as the binary-levels documentation draws it: one row per exchange,
/// with the wait of the queue it routed to. SQS hops get a row each.
pub fn route(hops: &[Hop]) -> String {
    let mut rows = Vec::new();
    let mut i = 0;
    while i < hops.len() {
        match &hops[i].step {
            HopStep::Exchange { name, routing_key, bcc, routed_to } => {
                let mut waited = "-".to_string();
                let mut then = "-".to_string();
                if let Some(Hop { step: HopStep::Queue { name: q, waited_ms, then: t }, .. }) = hops.get(i + 1)
                    && routed_to.contains(&format!("queue:{q}"))
                {
                    waited = duration(*waited_ms);
                    then = t.trim_start_matches("dead-lettered to ").replace(':', " ");
                    i += 1;
                }
                let routed = if routed_to.is_empty() { "(nothing)".into() } else { routed_to.iter().map(|r| strip_kind(r)).collect::<Vec<_>>().join(", ") };
                rows.push(vec![name.clone(), keys(routing_key, bcc), routed, waited, then]);
            }
            HopStep::Queue { name, waited_ms, then } | HopStep::SqsQueue { name, waited_ms, then } => {
                rows.push(vec![format!("queue {name}"), "-".into(), "-".into(), duration(*waited_ms), then.clone()]);
            }
            HopStep::Pump { queue, action, sends } => {
                rows.push(vec![format!("pump on {queue}"), "-".into(), sends.join(", "), "-".into(), action.clone()]);
            }
            HopStep::Held { stream, waited_ms, action, sends } => {
                rows.push(vec![format!("held stream {stream}"), "-".into(), sends.join(", "), duration(*waited_ms), action.clone()]);
            }
            HopStep::Scheduled { target, waited_ms, then } => {
                rows.push(vec!["schedule".into(), "-".into(), target.clone(), duration(*waited_ms), then.clone()]);
            }
        }
        i += 1;
    }
    table(&["EXCHANGE", "ROUTING KEY", "ROUTED TO", "DELAY IN QUEUE", "THEN"], &rows)
}

/// Each simulated message: a headline, its hops with times, and the outcome.
pub fn simulated(messages: &[SimulatedMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        let promised = m.promised_ms.map(|p| format!(", planned {}", duration(p))).unwrap_or_default();
        let _ = writeln!(out, "message {} to {}: delay {}{promised}", m.id, m.destination, duration(m.requested_ms));
        let rows: Vec<Vec<String>> = m
            .hops
            .iter()
            .map(|hop| match &hop.step {
                HopStep::Exchange { name, routing_key, bcc, routed_to } => vec![
                    duration(hop.at_ms),
                    "exchange".into(),
                    name.clone(),
                    keys(routing_key, bcc),
                    routed_to.iter().map(|r| strip_kind(r)).collect::<Vec<_>>().join(", "),
                ],
                HopStep::Queue { name, waited_ms, then } => {
                    vec![duration(hop.at_ms), "queue".into(), name.clone(), format!("waited {}", duration(*waited_ms)), then.replace(':', " ")]
                }
                HopStep::SqsQueue { name, waited_ms, then } => {
                    vec![duration(hop.at_ms), "sqs queue".into(), name.clone(), format!("waited {}", duration(*waited_ms)), then.clone()]
                }
                HopStep::Pump { queue, action, sends } => {
                    vec![duration(hop.at_ms), "pump".into(), queue.clone(), action.clone(), sends.join(", ")]
                }
                HopStep::Held { stream, waited_ms, action, sends } => {
                    vec![duration(hop.at_ms), "held".into(), stream.clone(), format!("waited {}, {action}", duration(*waited_ms)), sends.join(", ")]
                }
                HopStep::Scheduled { target, waited_ms, then } => {
                    vec![duration(hop.at_ms), "schedule".into(), target.clone(), format!("waited {}", duration(*waited_ms)), then.clone()]
                }
            })
            .collect();
        if !rows.is_empty() {
            for line in table(&["AT", "HOP", "NAME", "KEY / WAIT", "TO"], &rows).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        match (m.arrival_ms, &m.problem) {
            (Some(at), _) => {
                let _ = writeln!(out, "  delivered to {} at {}", m.destination, duration(at));
            }
            (None, Some(problem)) => {
                let _ = writeln!(out, "  NOT delivered: {problem}");
            }
            (None, None) => {}
        }
        out.push('\n');
    }
    out
}

/// Node identities for diagrams: exchanges and queues may share names.
struct Nodes {
    ids: BTreeMap<(char, String), String>,
}

impl Nodes {
    fn id(&mut self, kind: char, name: &str) -> String {
        let next = self.ids.len();
        self.ids.entry((kind, name.to_string())).or_insert_with(|| format!("{kind}{next}")).clone()
    }
}

fn display_name(name: &str) -> &str {
    if name.is_empty() { "(default)" } else { name }
}

/// Diagram edges: (from kind, from, to kind, to, label, dashed). Only
/// AMQP's bindings and dead-lettering join objects; SQS queues and NATS
/// streams stand alone.
fn edges(commands: &[Command]) -> Vec<(char, String, char, String, String, bool)> {
    let mut edges = Vec::new();
    for command in commands {
        let Command::Amqp(command) = command else { continue };
        match command {
            AmqpCommand::BindQueue { queue, exchange, routing_key, arguments: args } => {
                let label = if args.is_empty() { routing_key.clone() } else { arguments(args) };
                edges.push(('e', exchange.clone(), 'q', queue.clone(), label, false));
            }
            AmqpCommand::BindExchange { source, destination, routing_key, .. } => {
                edges.push(('e', source.clone(), 'e', destination.clone(), routing_key.clone(), false));
            }
            AmqpCommand::DeclareExchange { name, arguments: args, .. } => {
                // What the exchange routes nowhere goes on to its alternate.
                if let Some(alternate) = args.get("alternate-exchange").and_then(|v| v.as_text()) {
                    edges.push(('e', name.clone(), 'e', alternate.to_string(), "unrouted".into(), false));
                }
            }
            AmqpCommand::DeclareQueue { name, arguments: args, .. } => {
                if let Some(dlx) = args.get("x-dead-letter-exchange").and_then(|v| v.as_text()) {
                    let ttl = args.get("x-message-ttl").and_then(|v| v.as_int()).map(|t| format!("TTL {}", duration(t as u64)));
                    edges.push(('q', name.clone(), 'e', dlx.to_string(), ttl.unwrap_or_else(|| "dead-letter".into()), true));
                }
            }
            AmqpCommand::Publish { .. } => {}
        }
    }
    edges
}

/// Declared objects as diagram nodes: (kind, name, label); exchanges are 'e'.
fn node_list(commands: &[Command]) -> Vec<(char, String, String)> {
    commands
        .iter()
        .filter_map(Command::declared_object)
        .map(|DeclaredObject { kind, name, label }| {
            let kind = match kind {
                ObjectKind::Exchange => 'e',
                ObjectKind::Queue => 'q',
                ObjectKind::Stream => 'n',
            };
            (kind, name, label)
        })
        .collect()
}

pub fn mermaid(commands: &[Command]) -> String {
    let mut nodes = Nodes { ids: BTreeMap::new() };
    let mut out = String::from("graph TD\n");
    for (kind, name, label) in node_list(commands) {
        let id = nodes.id(kind, &name);
        let _ = match kind {
            'e' => writeln!(out, "  {id}([\"{label}\"])"),
            _ => writeln!(out, "  {id}[\"{label}\"]"),
        };
    }
    for (fk, from, tk, to, label, dashed) in edges(commands) {
        let (a, b) = (nodes.id(fk, &from), nodes.id(tk, &to));
        let arrow = if dashed { "-.->" } else { "-->" };
        let label = if label.is_empty() { String::new() } else { format!("|\"{}\"|", label.replace('"', "'")) };
        let _ = writeln!(out, "  {a} {arrow}{label} {b}");
    }
    // Names referenced but not declared here (destination queues, the default exchange).
    let declared: Vec<(char, String)> = node_list(commands).into_iter().map(|(k, n, _)| (k, n)).collect();
    for ((kind, name), id) in &nodes.ids {
        if !declared.contains(&(*kind, name.clone())) {
            let what = if *kind == 'e' { "exchange" } else { "queue" };
            let _ = writeln!(out, "  {id}[\"{what} {}\"]", display_name(name));
        }
    }
    out
}

/// The topology drawn as an SVG, for the status page: no script, no layout
/// engine. Each node sits one row below the longest chain of edges leading
/// to it (so a message's path reads top to bottom); exchanges have rounded
/// corners, queues square ones, dead-lettering is dashed; an edge's routing
/// key or TTL is its tooltip.
pub fn svg(commands: &[Command]) -> String {
    const ROW: usize = 56;
    const BOX: usize = 26;
    const GAP: usize = 16;
    const CHAR: usize = 7;
    let mut nodes = Nodes { ids: BTreeMap::new() };
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    for (kind, name, label) in node_list(commands) {
        labels.insert(nodes.id(kind, &name), label);
    }
    let edges: Vec<(String, String, String, bool)> =
        edges(commands).into_iter().map(|(fk, from, tk, to, label, dashed)| (nodes.id(fk, &from), nodes.id(tk, &to), label, dashed)).collect();
    for ((kind, name), id) in &nodes.ids {
        labels.entry(id.clone()).or_insert_with(|| format!("{} {}", if *kind == 'e' { "exchange" } else { "queue" }, display_name(name)));
    }
    // Rows by longest path; at most one pass per node, so a cycle cannot loop forever.
    let mut row: BTreeMap<&str, usize> = labels.keys().map(|id| (id.as_str(), 0)).collect();
    for _ in 0..labels.len() {
        let mut changed = false;
        for (from, to, _, _) in &edges {
            let below = row[from.as_str()] + 1;
            if from != to && row[to.as_str()] < below && below < labels.len() {
                row.insert(to.as_str(), below);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut order: Vec<&str> = labels.keys().map(String::as_str).collect();
    // Declaration order within a row reads like the topology's listing.
    order.sort_by_key(|id| (row[id], id[1..].parse::<usize>().unwrap_or(0)));
    let mut place: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    let mut next_x: BTreeMap<usize, usize> = BTreeMap::new();
    for id in &order {
        let width = labels[*id].len() * CHAR + 16;
        let x = next_x.entry(row[id]).or_insert(GAP);
        place.insert(id, (*x, row[id] * ROW + GAP, width));
        *x += width + GAP;
    }
    let width = next_x.values().max().copied().unwrap_or(GAP);
    let height = row.values().max().map_or(0, |r| (r + 1) * ROW) + GAP;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"topology\" width=\"{width}\" height=\"{height}\" font-family=\"monospace\" font-size=\"12\">\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\"><path d=\"M0,0L10,5L0,10z\"/></marker></defs>\n"
    );
    for (from, to, label, dashed) in &edges {
        let ((fx, fy, fw), (tx, ty, tw)) = (place[from.as_str()], place[to.as_str()]);
        let (x1, y1, x2, y2) = (fx + fw / 2, fy + BOX, tx + tw / 2, ty);
        let dash = if *dashed { " stroke-dasharray=\"4 3\"" } else { "" };
        let _ = writeln!(
            out,
            "<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" stroke=\"#888\"{dash} marker-end=\"url(#arrow)\"><title>{}</title></line>",
            xml_escape(label)
        );
    }
    for id in &order {
        let (x, y, w) = place[id];
        let rounded = if id.starts_with('e') { " rx=\"12\"" } else { "" };
        let _ = writeln!(
            out,
            "<g class=\"node\"><rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{BOX}\"{rounded} fill=\"#f4f4f4\" stroke=\"#444\"/><text x=\"{}\" y=\"{}\">{}</text></g>",
            x + 8,
            y + 17,
            xml_escape(&labels[*id])
        );
    }
    out.push_str("</svg>\n");
    out
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub fn dot(commands: &[Command]) -> String {
    let mut nodes = Nodes { ids: BTreeMap::new() };
    let mut out = String::from("digraph topology {\n  rankdir=TB;\n");
    for (kind, name, label) in node_list(commands) {
        let id = nodes.id(kind, &name);
        let shape = if kind == 'e' { "ellipse" } else { "box" };
        let _ = writeln!(out, "  {id} [shape={shape}, label=\"{label}\"];");
    }
    for (fk, from, tk, to, label, dashed) in edges(commands) {
        let (a, b) = (nodes.id(fk, &from), nodes.id(tk, &to));
        let style = if dashed { ", style=dashed" } else { "" };
        let _ = writeln!(out, "  {a} -> {b} [label=\"{}\"{style}];", label.replace('"', "'"));
    }
    let declared: Vec<(char, String)> = node_list(commands).into_iter().map(|(k, n, _)| (k, n)).collect();
    for ((kind, name), id) in &nodes.ids {
        if !declared.contains(&(*kind, name.clone())) {
            let what = if *kind == 'e' { "exchange" } else { "queue" };
            let _ = writeln!(out, "  {id} [shape=box, style=dotted, label=\"{what} {}\"];", display_name(name));
        }
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{ExchangeKind, FieldValue};

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(8_000), "8s");
        assert_eq!(duration(1_925_000), "32m 5s");
        assert_eq!(duration(250), "250ms");
    }

    #[test]
    fn diagrams_show_bindings_and_dead_letter_edges() {
        let commands = vec![
            Command::Amqp(AmqpCommand::DeclareExchange { name: "x".into(), kind: ExchangeKind::Topic, durable: true, arguments: FieldTable::new() }),
            Command::Amqp(AmqpCommand::DeclareQueue {
                name: "q".into(),
                durable: true,
                arguments: [("x-message-ttl".to_string(), FieldValue::Int(2_000)), ("x-dead-letter-exchange".to_string(), FieldValue::Text("x".into()))].into(),
            }),
            Command::Amqp(AmqpCommand::BindQueue { queue: "q".into(), exchange: "x".into(), routing_key: "1.#".into(), arguments: FieldTable::new() }),
        ];
        let m = mermaid(&commands);
        assert!(m.contains("e0 -->|\"1.#\"| q1"), "{m}");
        assert!(m.contains("q1 -.->|\"TTL 2s\"| e0"), "{m}");
        let d = dot(&commands);
        assert!(d.contains("q1 -> e0 [label=\"TTL 2s\", style=dashed]"), "{d}");
    }

    #[test]
    fn the_svg_draws_every_node_once_and_places_each_below_what_feeds_it() {
        let queue = |name: &str, dlx: &str| {
            Command::Amqp(AmqpCommand::DeclareQueue {
                name: name.into(),
                durable: true,
                arguments: [("x-dead-letter-exchange".to_string(), FieldValue::Text(dlx.into()))].into(),
            })
        };
        let exchange = |name: &str| {
            Command::Amqp(AmqpCommand::DeclareExchange { name: name.into(), kind: ExchangeKind::Topic, durable: true, arguments: FieldTable::new() })
        };
        let bind = |queue: &str, exchange: &str| {
            Command::Amqp(AmqpCommand::BindQueue { queue: queue.into(), exchange: exchange.into(), routing_key: "<1>.#".into(), arguments: FieldTable::new() })
        };
        let commands = vec![exchange("top"), queue("wait", "next"), exchange("next"), bind("wait", "top"), bind("orders", "next")];
        let svg = svg(&commands);
        assert_eq!(svg.matches("<rect").count(), 4, "top, wait, next and the destination orders: {svg}");
        assert_eq!(svg.matches("<line").count(), 3, "{svg}");
        assert_eq!(svg.matches("stroke-dasharray").count(), 1, "one dead-letter edge: {svg}");
        assert!(svg.contains("<title>&lt;1&gt;.#</title>"), "routing keys are escaped tooltips: {svg}");
        let y_of = |label: &str| -> usize {
            let at = svg.find(&format!(">{label}</text>")).unwrap_or_else(|| panic!("{label} missing: {svg}"));
            let text = &svg[..at];
            let y = &text[text.rfind(" y=\"").unwrap() + 4..];
            y[..y.find('"').unwrap()].parse().unwrap()
        };
        let rows = ["exchange top (topic)", "queue wait", "exchange next (topic)", "queue orders"].map(y_of);
        assert!(rows.windows(2).all(|pair| pair[0] < pair[1]), "each node a row below what feeds it: {rows:?}");
    }
}
