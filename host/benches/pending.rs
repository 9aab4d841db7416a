//! A million delayed messages pending: what each costs the broker, that the
//! host's memory stays flat (the broker holds them), and that messages sent
//! with that many pending still arrive on time. Runs the release
//! `hourglass serve` as a child process and measures its RSS, and the broker
//! node's memory (with its breakdown) and data directory before loading and
//! after, each once it has settled.
//!
//! The broker is a RabbitMQ node of the bench's own (no plugins; started as
//! the fault suite starts one, stopped and removed at the end), so nothing
//! else's queues are in its figures. `BENCH_BROKER=shared` uses the broker
//! on $HOURGLASS_AMQP_URL instead, read with `rabbitmqctl` on its default node.
//! `BENCH_LEVELS=classic` runs classic levels (quorum by default).
//! Run: `cargo bench -p hourglass --bench pending [MESSAGES]`. Method: BENCHMARKS.md ("A million pending").

mod support;

// The fault suite's private node, used as it is there; it picks its ports with `ports`.
// Its own test module's import is unused outside the test harness.
#[allow(unused_imports)]
#[path = "../../tests/src/ports.rs"]
mod ports;
#[allow(dead_code)]
#[path = "../../tests/src/private_node.rs"]
mod private_node;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use hourglass::config::Config;
use hourglass::config::broker::amqp_url;
use lapin::options::{ConfirmSelectOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use private_node::PrivateNode;
use support::{collect_lateness, declare_queue, ingress_config_text, now_ms, percentile, publish_to_ingress};

/// Messages sent with the million pending, spread over this many seconds.
const SAMPLES: usize = 100;
const SAMPLE_SPREAD: Duration = Duration::from_secs(20);

/// The node's memory counts as settled when, over the last `SETTLE_WINDOW`
/// readings `SETTLE_EVERY` apart, it moved less than `SETTLE_TOLERANCE` of
/// itself (or `SETTLE_FLOOR`, for an empty node); it is read anyway after `SETTLE_LIMIT`.
const SETTLE_EVERY: Duration = Duration::from_secs(5);
const SETTLE_WINDOW: usize = 12;
const SETTLE_TOLERANCE: f64 = 0.02;
const SETTLE_FLOOR: u64 = 4 * 1024 * 1024;
const SETTLE_LIMIT: Duration = Duration::from_secs(300);

/// The pending count the projection is for.
const PROJECTED: u64 = 10_000_000;

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = MIB * 1024.0;

/// The RabbitMQ node the messages wait on, reached with `rabbitmqctl` as user
/// rabbitmq (whose Erlang cookie every node here shares).
enum Node {
    Private(PrivateNode),
    /// The node `rabbitmqctl` reaches by default: the shared broker.
    Shared,
}

impl Node {
    fn name(&self) -> String {
        match self {
            Node::Private(node) => format!("{} (the bench's own, no plugins)", node.name),
            Node::Shared => "the shared broker's default node (other users' queues included)".to_string(),
        }
    }

    /// `rabbitmqctl -q ARGS` on the node: its output.
    fn ctl(&self, args: &[&str]) -> String {
        match self {
            Node::Private(node) => node.ctl(args).expect("rabbitmqctl on the bench's node"),
            Node::Shared => {
                let output = Command::new("runuser").args(["-u", "rabbitmq", "--", "rabbitmqctl", "-q"]).args(args).output().expect("runuser rabbitmqctl");
                assert!(output.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
                String::from_utf8_lossy(&output.stdout).into_owned()
            }
        }
    }

    /// `rabbitmqctl eval EXPRESSION` on the node: the printed Erlang term.
    fn eval(&self, expression: &str) -> String {
        self.ctl(&["eval", expression])
    }

    /// Messages, and their bytes, that the queues named `prefix…` keep in memory
    /// (`messages_ram`, `message_bytes_ram`): a classic queue pages the rest to disk.
    fn in_memory(&self, prefix: &str) -> (u64, u64) {
        let text = self.ctl(&["list_queues", "name", "messages_ram", "message_bytes_ram"]);
        let rows = text.lines().map(|line| line.split_whitespace().collect::<Vec<_>>()).filter(|row| row.len() == 3 && row[0].starts_with(prefix));
        rows.map(|row| (row[1].parse::<u64>().unwrap_or(0), row[2].parse::<u64>().unwrap_or(0))).fold((0, 0), |(m, b), (rm, rb)| (m + rm, b + rb))
    }

    /// What the memory alarm compares with its limit (`mem_used` in the
    /// management API; the VM's RSS under the default `rss` strategy).
    fn used(&self) -> u64 {
        self.eval("vm_memory_monitor:get_process_memory().").trim().parse().expect("the node's memory in bytes")
    }

    /// The operating-system pid of the node's VM, whose RSS is its memory under the `rss` strategy.
    fn os_pid(&self) -> u32 {
        self.eval("os:getpid().").trim().trim_matches('"').parse().expect("the node's pid")
    }

    fn memory(&self) -> NodeMemory {
        // A flat list of {atom, integer}: `rabbit_vm:memory()`'s categories (its
        // `strategy` and `total` entries are not integers), and the alarm's figures.
        let text = self.eval(
            "[{used, vm_memory_monitor:get_process_memory()}, {limit, vm_memory_monitor:get_memory_limit()}, \
             {ram, vm_memory_monitor:get_total_memory()} | [KV || {_, V} = KV <- rabbit_vm:memory(), is_integer(V)]].",
        );
        let tokens: Vec<String> = text.replace(['[', ']', '{', '}'], "").split(',').map(|token| token.trim().to_string()).collect();
        let mut figures: BTreeMap<String, u64> =
            tokens.chunks(2).map(|pair| (pair[0].clone(), pair[1].parse().unwrap_or_else(|_| panic!("a byte count in {text}")))).collect();
        let mut take = |key: &str| figures.remove(key).unwrap_or_else(|| panic!("{key} in {text}"));
        let (used, limit, ram) = (take("used"), take("limit"), take("ram"));
        NodeMemory { used, limit, ram, breakdown: figures }
    }

    /// Bytes in the node's data directory (message store, quorum queues' logs,
    /// schema), and of them in the quorum queues' write-ahead log files.
    fn disk(&self) -> Disk {
        let dir = PathBuf::from(self.eval("rabbit_mnesia:dir().").trim().trim_matches('"'));
        Disk { all: bytes_under(&dir, &|_| true), write_ahead_log: bytes_under(&dir, &|name| name.ends_with(".wal")) }
    }
}

struct NodeMemory {
    used: u64,
    /// The memory high watermark in bytes.
    limit: u64,
    /// The machine's memory as the node sees it.
    ram: u64,
    /// `rabbit_vm:memory()` by category; under the `rss` strategy they add up to the RSS.
    breakdown: BTreeMap<String, u64>,
}

/// The categories of `rabbit_vm:memory()` shown while loading: where pending messages and a load in progress go.
const LOADING_CATEGORIES: [&str; 6] = ["queue_procs", "quorum_queue_procs", "quorum_ets", "binary", "msg_index", "allocated_unused"];

struct Disk {
    all: u64,
    write_ahead_log: u64,
}

/// One reading of the node once its memory settled.
struct Reading {
    memory: NodeMemory,
    disk: Disk,
    /// Messages and bytes the run's queues keep in memory.
    in_memory: (u64, u64),
    host_rss: f64,
    /// How long the memory took to settle, and whether it did within `SETTLE_LIMIT`.
    waited: Duration,
    settled: bool,
}

/// Bytes in the files under `dir` whose names `counted` accepts.
fn bytes_under(dir: &Path, counted: &dyn Fn(&str) -> bool) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => bytes_under(&entry.path(), counted),
            _ if counted(&entry.file_name().to_string_lossy()) => entry.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// A memory line of `/proc/<pid>/status`, in MiB.
fn status_mib(pid: u32, line: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status.lines().find(|l| l.starts_with(line)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    kib / 1024.0
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn forwarded(base: &str) -> u64 {
    let text = ureq::get(&format!("{base}/metrics")).call().ok().and_then(|mut r| r.body_mut().read_to_string().ok()).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("hourglass_ingress_messages_total") && l.contains("forwarded"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// `hourglass serve` as a child: stopped with SIGTERM when dropped, so a run
/// that fails half-way leaves no host consuming.
struct Host {
    child: Child,
}

impl Host {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: kill only sends a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.wait();
    }
}

/// The host's RSS as the run goes: its peak, and its range once the first fifth is pending.
struct HostMemory {
    pid: u32,
    peak: f64,
    loaded_range: Option<(f64, f64)>,
}

impl HostMemory {
    fn read(&mut self, loaded: bool) -> f64 {
        let rss = rss_mib(self.pid);
        self.peak = self.peak.max(rss);
        if loaded {
            let (low, high) = self.loaded_range.unwrap_or((rss, rss));
            self.loaded_range = Some((low.min(rss), high.max(rss)));
        }
        rss
    }
}

/// Reads the node's memory every `SETTLE_EVERY` until it settles (or
/// `SETTLE_LIMIT` passes), printing a line every half minute; then its
/// breakdown, data directory and the messages the run's queues keep in memory.
async fn settle(node: &Arc<Node>, prefix: &str, host: &mut HostMemory, loaded: bool, label: &str) -> Reading {
    let start = Instant::now();
    let mut recent: Vec<u64> = Vec::new();
    let settled = loop {
        let probe = node.clone();
        recent.push(tokio::task::spawn_blocking(move || probe.used()).await.unwrap());
        let rss = host.read(loaded);
        let window = &recent[recent.len().saturating_sub(SETTLE_WINDOW)..];
        let (low, high) = (*window.iter().min().unwrap(), *window.iter().max().unwrap());
        if recent.len() % 6 == 1 {
            println!(
                "  {label}: {:>4.0} s, node {:.0} MiB (last minute {:.0}–{:.0}), host RSS {rss:.1} MiB",
                start.elapsed().as_secs_f64(),
                recent[recent.len() - 1] as f64 / MIB,
                low as f64 / MIB,
                high as f64 / MIB
            );
        }
        if window.len() == SETTLE_WINDOW && (high - low) as f64 <= (SETTLE_TOLERANCE * high as f64).max(SETTLE_FLOOR as f64) {
            break true;
        }
        if start.elapsed() > SETTLE_LIMIT {
            break false;
        }
        tokio::time::sleep(SETTLE_EVERY).await;
    };
    let (probe, prefix) = (node.clone(), prefix.to_string());
    let (memory, disk, in_memory) = tokio::task::spawn_blocking(move || (probe.memory(), probe.disk(), probe.in_memory(&prefix))).await.unwrap();
    Reading { memory, disk, in_memory, host_rss: host.read(loaded), waited: start.elapsed(), settled }
}

/// What one run measures once the host serves: loading, lateness with them
/// pending, and the node's memory settled before and after.
struct Run {
    messages: u64,
    quorum: bool,
    node: Arc<Node>,
    base: String,
    /// What the run's queues are named with.
    prefix: String,
    channel: lapin::Channel,
    /// Where the sampled messages are consumed.
    sampled_channel: lapin::Channel,
    ingress: String,
    far: String,
    sampled: String,
    host: HostMemory,
}

impl Run {
    async fn measure(mut self) {
        let levels = if self.quorum { "quorum" } else { "classic" };
        let messages = self.messages;
        println!(
            "{messages} messages to pending (delays 1–3 h, binary-levels, 28 {levels} direct levels) through the ingress of `hourglass serve` (pid {}); node {}; load average {}",
            self.host.pid,
            self.node.name(),
            load_average()
        );
        let before = settle(&self.node, &self.prefix, &mut self.host, false, "before loading").await;
        println!(
            "before loading: node {:.0} MiB (settled {} after {:.0} s), data directory {:.1} MiB, host RSS {:.1} MiB; the machine's memory {:.1} GiB, high watermark {:.2} GiB",
            before.memory.used as f64 / MIB,
            if before.settled { "yes" } else { "NO" },
            before.waited.as_secs_f64(),
            before.disk.all as f64 / MIB,
            before.host_rss,
            before.memory.ram as f64 / GIB,
            before.memory.limit as f64 / GIB
        );
        println!("| pending | host RSS MiB | node MiB | ingress backlog | {} (MiB) | s since start |", LOADING_CATEGORIES.join(" | "));
        println!("|---:|---:|---:|---:|{}---:|", "---:|".repeat(LOADING_CATEGORIES.len()));
        let node_pid = {
            let node = self.node.clone();
            tokio::task::spawn_blocking(move || node.os_pid()).await.unwrap()
        };
        let mut node_peak = 0.0_f64;

        // Phase 1: the messages, published in windows of 1,000 confirms while the host drains them.
        let start = Instant::now();
        let producer = {
            let (channel, ingress, far) = (self.channel.clone(), self.ingress.clone(), self.far.clone());
            tokio::spawn(async move {
                let mut confirms = Vec::with_capacity(1_000);
                for i in 0..messages {
                    confirms.push(publish_to_ingress(&channel, &ingress, &far, 3_600_000 + (i * 7_919) % 7_200_000, &[b'x'; 100]).await);
                    if confirms.len() == 1_000 {
                        for confirm in confirms.drain(..) {
                            confirm.await.expect("confirm");
                        }
                    }
                }
                for confirm in confirms {
                    confirm.await.expect("confirm");
                }
            })
        };
        let mut next_report = messages / 5;
        loop {
            let done = forwarded(&self.base);
            let rss = self.host.read(done >= messages / 5);
            node_peak = node_peak.max(rss_mib(node_pid));
            if done >= next_report {
                let node = self.node.clone();
                let memory = tokio::task::spawn_blocking(move || node.memory()).await.unwrap();
                let passive = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
                let backlog =
                    self.channel.queue_declare(self.ingress.as_str().into(), passive, Default::default()).await.map(|q| q.message_count()).unwrap_or(0);
                let categories: Vec<String> =
                    LOADING_CATEGORIES.iter().map(|c| format!("{:.0}", memory.breakdown.get(*c).copied().unwrap_or(0) as f64 / MIB)).collect();
                println!(
                    "| {done} | {rss:.1} | {:.0} | {backlog} | {} | {:.0} |",
                    memory.used as f64 / MIB,
                    categories.join(" | "),
                    start.elapsed().as_secs_f64()
                );
                next_report += messages / 5;
            }
            if done >= messages {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(1_800), "only {done} of {messages} forwarded in 30 min");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        producer.await.unwrap();
        let loaded_in = start.elapsed();
        println!(
            "loaded in {:.0} s ({:.0} msg/s through the ingress); the node's RSS peaked at {node_peak:.0} MiB while loading (read every 250 ms)",
            loaded_in.as_secs_f64(),
            messages as f64 / loaded_in.as_secs_f64()
        );

        // Phase 2: with them pending, messages of 5–15 s delays, one every 200 ms; lateness from each send.
        let arrivals = collect_lateness(self.sampled_channel.clone(), &self.sampled, SAMPLES);
        for i in 0..SAMPLES as u64 {
            let delay = 5_000 + (i * 997) % 10_000;
            let due = (now_ms() + delay).to_string();
            publish_to_ingress(&self.channel, &self.ingress, &self.sampled, delay, due.as_bytes()).await.await.expect("confirm");
            self.host.read(true);
            tokio::time::sleep(SAMPLE_SPREAD / SAMPLES as u32).await;
        }
        let lateness = arrivals.await.unwrap().from_send;
        println!(
            "{} of {SAMPLES} sampled messages arrived with {messages} pending; early: {}; lateness p50 {} ms, p99 {} ms, max {} ms",
            lateness.len(),
            lateness.iter().filter(|&&ms| ms < 0).count(),
            percentile(&lateness, 0.5),
            percentile(&lateness, 0.99),
            lateness.last().unwrap()
        );

        // Phase 3: the node's memory with them pending, settled; for quorum
        // levels again after the write-ahead log rolls over, which moves the
        // entries it holds in memory (ETS) to the queues' segment files.
        let pending = settle(&self.node, &self.prefix, &mut self.host, true, "pending").await;
        let mut readings = vec![("before loading", &before), ("pending, settled", &pending)];
        let rolled = match (&*self.node, self.quorum) {
            (Node::Private(_), true) => {
                let node = self.node.clone();
                let answer = tokio::task::spawn_blocking(move || node.eval("ra_log_wal:force_roll_over(ra_log_wal).")).await.unwrap();
                println!("write-ahead log rolled over: {}", answer.trim());
                Some(settle(&self.node, &self.prefix, &mut self.host, true, "after the roll-over").await)
            }
            _ => None,
        };
        if let Some(rolled) = &rolled {
            readings.push(("after the WAL roll-over", rolled));
        }
        println!("load average {}", load_average());
        let wal_max = match self.quorum {
            true => {
                let node = self.node.clone();
                let answer = tokio::task::spawn_blocking(move || node.eval("maps:get(wal_max_size_bytes, ra_system:fetch(quorum_queues)).")).await.unwrap();
                answer.trim().parse().ok()
            }
            false => None,
        };
        report(messages, &readings, &self.host, wal_max, node_peak);
    }
}

/// The node's figures side by side, per pending message, and projected to [`PROJECTED`].
/// `wal_max` is the quorum queues' write-ahead log size; `loading_peak` the node's RSS peak while loading, in MiB.
fn report(messages: u64, readings: &[(&str, &Reading)], host: &HostMemory, wal_max: Option<u64>, loading_peak: f64) {
    let before = readings[0].1;
    let per_message = |bytes: u64, base: u64| (bytes as f64 - base as f64) / messages as f64;
    println!("\n| node | {} |", readings.iter().map(|(label, _)| *label).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(readings.len()));
    let row =
        |name: &str, cell: &dyn Fn(&Reading) -> String| println!("| {name} | {} |", readings.iter().map(|(_, r)| cell(r)).collect::<Vec<_>>().join(" | "));
    row("memory (mem_used), MiB", &|r| format!("{:.0}", r.memory.used as f64 / MIB));
    row("settled after", &|r| format!("{:.0} s{}", r.waited.as_secs_f64(), if r.settled { "" } else { " (not settled)" }));
    row("data directory, MiB", &|r| format!("{:.0}", r.disk.all as f64 / MIB));
    row("  write-ahead log files, MiB", &|r| format!("{:.0}", r.disk.write_ahead_log as f64 / MIB));
    row("messages in memory (list_queues messages_ram), MiB of them", &|r| format!("{} ({:.0})", r.in_memory.0, r.in_memory.1 as f64 / MIB));
    row("host RSS, MiB", &|r| format!("{:.1}", r.host_rss));
    row("memory per pending message, bytes", &|r| format!("{:.0}", per_message(r.memory.used, before.memory.used)));
    row("disk per pending message, bytes", &|r| format!("{:.0}", per_message(r.disk.all, before.disk.all)));
    // The categories that moved by a MiB or more in any reading.
    for category in before.memory.breakdown.keys() {
        let of = |r: &Reading| r.memory.breakdown.get(category).copied().unwrap_or(0);
        if readings.iter().any(|(_, r)| (of(r) as f64 - of(before) as f64).abs() >= MIB) {
            row(&format!("  {category}, MiB"), &|r| format!("{:.0} ({:+.0} B/msg)", of(r) as f64 / MIB, per_message(of(r), of(before))));
        }
    }

    let limit = before.memory.limit as f64;
    let verdict = |bytes: f64| {
        let fits = if bytes < limit { "fits" } else { "over: publishers are blocked" };
        format!("{:.1} GiB, {:.0} % of the high watermark {:.2} GiB ({fits})", bytes / GIB, 100.0 * bytes / limit, limit / GIB)
    };
    // The last reading is the steady one: after the roll-over on quorum levels.
    let (label, steady) = readings[readings.len() - 1];
    let projected = before.memory.used as f64 + per_message(steady.memory.used, before.memory.used) * PROJECTED as f64;
    let disk = before.disk.all as f64 + per_message(steady.disk.all, before.disk.all) * PROJECTED as f64;
    println!(
        "\nprojected to {PROJECTED} pending, the node before loading plus {PROJECTED} × the per-message figure {label}: {}; disk {:.1} GiB",
        verdict(projected),
        disk / GIB
    );
    if let (Some(wal_max), [_, (_, pending), _]) = (wal_max, readings) {
        // Not scaled: the log keeps its entries in memory until it reaches its size, however many are pending.
        let held = pending.memory.used as f64 - steady.memory.used as f64;
        println!(
            "  plus what the write-ahead log held in memory at the settled reading ({:.0} MiB; it holds them until it reaches {:.0} MiB and rolls over): {}",
            held / MIB,
            wal_max as f64 / MIB,
            verdict(projected + held)
        );
    }
    println!("  while loading, the node's RSS peaked at {loading_peak:.0} MiB (the ingress queue's backlog included)");
    let (low, high) = host.loaded_range.unwrap_or_default();
    println!("host RSS from the first fifth loaded to the end: {low:.1}–{high:.1} MiB, peak {:.1} MiB (target < 64 MiB, flat)", host.peak);
    // The file-backed part is the binary's code the process touched, shared with the page cache.
    let (anonymous, files) = (status_mib(host.pid, "RssAnon:"), status_mib(host.pid, "RssFile:"));
    println!("  of the host's RSS at the end: {anonymous:.1} MiB anonymous (its heap and stacks), {files:.1} MiB mapped from files (its binary's code)");
}

#[tokio::main]
async fn main() {
    let messages: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1_000_000);
    let quorum = match std::env::var("BENCH_LEVELS").as_deref() {
        Ok("classic") => false,
        Ok("quorum") | Err(_) => true,
        Ok(other) => panic!("BENCH_LEVELS={other}: quorum or classic"),
    };
    let node = match std::env::var("BENCH_BROKER").as_deref() {
        Ok("shared") => Node::Shared,
        _ => Node::Private(tokio::task::spawn_blocking(PrivateNode::start).await.unwrap().expect("a private RabbitMQ node starts")),
    };
    let node = Arc::new(node);
    let (url, management) = match &*node {
        Node::Private(private) => (private.url(), "management_url = \"http://127.0.0.1:1\"\n"),
        Node::Shared => (amqp_url(None, None), ""),
    };
    let connection = Connection::connect(&url, ConnectionProperties::default()).await.expect("RabbitMQ");
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let run = support::run_id();
    // Not under the strategy's prefix (`bench-pending-{run}.`), whose own queues (`.parked`, …) it declares itself.
    let (ingress, far, sampled) = (format!("bench-pending-{run}-in"), format!("bench-pending-{run}-far"), format!("bench-pending-{run}-sampled"));
    for queue in [&ingress, &far, &sampled] {
        declare_queue(&channel, queue, false).await;
    }
    let strategy = if quorum { "" } else { "queue_type = \"classic\"\n" };
    // On the bench's node, a management URL nothing answers: the shared node's API on 15672 would describe another broker.
    let text = ingress_config_text(&url, &format!("bench-pending-{run}"), &ingress, strategy, management);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("delay.toml");
    std::fs::write(&config_path, &text).unwrap();
    let config = Config::parse(Path::new("bench.toml"), text).expect("bench config");

    let outcome = {
        let mut host = Host {
            child: Command::new(env!("CARGO_BIN_EXE_hourglass"))
                .args(["--config", config_path.to_str().unwrap(), "serve", "--listen", "127.0.0.1:0"])
                .env("HOURGLASS_AMQP_URL", &url)
                .env_remove("HOURGLASS_MANAGEMENT_URL")
                .stderr(Stdio::piped())
                .spawn()
                .expect("hourglass serve starts"),
        };
        let pid = host.pid();
        let mut stderr = BufReader::new(host.child.stderr.take().unwrap());
        let base = loop {
            let mut line = String::new();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "hourglass serve ended before it served");
            eprint!("serve: {line}");
            if let Some(rest) = line.split("serving on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        // Keep reading its log so the pipe never fills.
        std::thread::spawn(move || for _ in stderr.lines() {});
        let started_rss = rss_mib(pid);
        println!("host RSS at start: {started_rss:.1} MiB");
        let measure = Run {
            messages,
            quorum,
            node: node.clone(),
            base,
            prefix: format!("bench-pending-{run}"),
            channel: channel.clone(),
            sampled_channel: connection.create_channel().await.unwrap(),
            ingress: ingress.clone(),
            far: far.clone(),
            sampled: sampled.clone(),
            host: HostMemory { pid, peak: started_rss, loaded_range: None },
        }
        .measure();
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        let outcome = tokio::select! {
            outcome = AssertUnwindSafe(measure).catch_unwind() => outcome.map_err(Some),
            _ = tokio::signal::ctrl_c() => Err(None),
            _ = terminate.recv() => Err(None),
        };
        drop(host);
        outcome
    };

    // Every queue of the run goes, whether it ended or failed: the bench's own node with its data,
    // or on the shared broker each queue and exchange by name.
    // A reading interrupted by a signal may still hold the node for a moment.
    let mut node = node;
    let node = loop {
        match Arc::try_unwrap(node) {
            Ok(node) => break node,
            Err(shared) => node = shared,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    match node {
        Node::Shared => {
            for queue in [ingress.clone(), format!("{ingress}.invalid"), far, sampled] {
                channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.ok();
            }
            support::delete_topology(&connection.create_channel().await.unwrap(), &config).await;
        }
        Node::Private(private) => {
            connection.close(0, "done".into()).await.ok();
            tokio::task::spawn_blocking(move || drop(private)).await.unwrap();
        }
    }
    match outcome {
        Ok(()) => {}
        Err(Some(panic)) => std::panic::resume_unwind(panic),
        Err(None) => {
            eprintln!("interrupted; cleaned up");
            std::process::exit(130);
        }
    }
}
