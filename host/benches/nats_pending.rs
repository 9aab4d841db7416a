//! NATS: what a waiting message costs the server. On JetStream a delayed
//! message waits in the held stream, delivered to the host's durable consumer
//! `hourglass-hold` and declined with the time left (at most `max_wait`), so
//! each is a stored message and one ack-pending entry with its redelivery
//! timer. This bench loads many and reads what the server keeps for them.
//!
//! It starts a nats-server of its own (`scripts/nats-server`: 2.9 is the
//! machine's, `HOURGLASS_TEST_NATS=2.15` Debian sid's) with JetStream on a
//! free port, a store under the temporary directory and its Go profiler on
//! the next port; `serve` in this process with a `nats-hold` strategy and the
//! ingress subject; and publishes the messages to the ingress (100-byte
//! bodies, `hourglass-delay` 2 h, so none comes due during the run; windows
//! of 1,000 acknowledgements, a chunk of 100,000 at a time, the next once the
//! host is less than a chunk behind). Settled readings before loading, at
//! 100,000 and at the end: the server's RSS read every 5 s until a minute of
//! them lie within 2 % (once the stream's duplicate window has passed over
//! the last publish), its live heap after a collection (by allocation site),
//! its store on disk, and its RSS again two minutes after that collection; a
//! reading as it goes at every 100,000; and 100 messages of 3–8 s delays sent
//! at each settled point, their lateness from the send. Everything is deleted
//! and the server stopped at the end, also after a failure or an interrupt.
//!
//! Run: `cargo bench -p hourglass --bench nats_pending --profile dev [MESSAGES]`
//! (or `BENCH_PENDING`; default 1,000,000). `BENCH_LOAD_LIMIT` (seconds,
//! default 900) stops loading at the next chunk past it; `BENCH_CPU_PROFILE=<dir>`
//! saves the server's CPU profiles. Method: BENCHMARKS.md ("NATS: what a
//! waiting message costs the server").

mod support;

// Ports below the kernel's ephemeral range, as the tests' private servers take them.
#[allow(unused_imports)]
#[path = "../../tests/src/ports.rs"]
mod ports;

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, stream};
use futures_util::{FutureExt, StreamExt};
use hourglass::config::Config;
use support::{Served, now_ms, percentile};

/// Published, then acknowledged by the server, in windows of this many.
const WINDOW: usize = 1_000;
/// Loaded a chunk at a time, with a reading after each.
const CHUNK: u64 = 100_000;
/// The delay every loaded message is scheduled with: none comes due during the run.
const DELAY: &str = "2h";
const BODY: [u8; 100] = [b'x'; 100];
/// A stream's duplicate window (JetStream's default): the message ids of the last
/// two minutes' publishes are kept in memory, so settled readings start after it.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Settled: the last `SETTLE_WINDOW` readings of the server's RSS, `SETTLE_EVERY`
/// apart, within `SETTLE_TOLERANCE` of the highest (or `SETTLE_FLOOR`); read anyway after `SETTLE_LIMIT`.
const SETTLE_EVERY: Duration = Duration::from_secs(5);
const SETTLE_WINDOW: usize = 12;
const SETTLE_TOLERANCE: f64 = 0.02;
const SETTLE_FLOOR: u64 = 1024 * 1024;
const SETTLE_LIMIT: Duration = Duration::from_secs(300);
/// The server's RSS is read again this long after the settled reading's collection: when the Go
/// runtime returns freed memory to the system depends on when it collects, so both are given.
const AFTER_COLLECTION: Duration = Duration::from_secs(120);

/// Sampled at each settled point: this many messages, one every `SAMPLE_EVERY`, delays 3–8 s.
const SAMPLES: u64 = 100;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

const MIB: f64 = 1024.0 * 1024.0;

/// A nats-server of the version under test that only this bench uses. Killed on drop, its store removed.
struct PrivateServer {
    port: u16,
    profiler: u16,
    store: PathBuf,
    child: std::process::Child,
}

impl PrivateServer {
    async fn start() -> PrivateServer {
        let port = ports::free_ports(&[0, 1]).expect("free ports for a private nats-server");
        let temp = std::env::temp_dir().canonicalize().expect("the temporary directory");
        let store = temp.join(format!("hourglass-bench-nats-{port}-{}", support::run_id()));
        std::fs::create_dir_all(&store).expect("the server's store");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nats-server");
        let child = std::process::Command::new(script)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "--profile", &(port + 1).to_string(), "-js", "-sd"])
            .arg(store.join("jetstream"))
            .arg("-l")
            .arg(store.join("log"))
            .spawn()
            .expect("scripts/nats-server starts");
        let server = PrivateServer { port, profiler: port + 1, store, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while async_nats::connect(server.url()).await.is_err() {
            assert!(Instant::now() < deadline, "the private nats-server did not take connections within a minute (log: {:?})", server.store.join("log"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's process: `scripts/nats-server` ends in `exec` (through `chroot`, which execs too).
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.store).ok();
    }
}

/// A memory line of `/proc/<pid>/status` (`VmRSS:`), in bytes.
fn status_bytes(pid: &str, line: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: u64 = status.lines().find(|l| l.starts_with(line)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0);
    kib * 1024
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, after_name)) = text.rsplit_once(')') else { return 0.0 };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).into_iter().flatten().filter_map(|f| f.parse::<u64>().ok()).sum();
    // SAFETY: sysconf only reads a constant of the system.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Bytes allocated on disk (as `du` counts them) under `dir`, and of them under subdirectories named `held`
/// (the held stream's) and, inside that, `obs` (its consumer's state).
fn disk_usage(dir: &Path, held: &str) -> Disk {
    fn walk(dir: &Path, held: &str, in_held: bool, in_obs: bool, disk: &mut Disk) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name().to_string_lossy().into_owned();
            if meta.is_dir() {
                walk(&entry.path(), held, in_held || name == held, in_obs || (in_held && name == "obs"), disk);
            }
            let bytes = meta.blocks() * 512;
            disk.all += bytes;
            if in_held {
                disk.held += bytes;
            }
            if in_obs {
                disk.consumer += bytes;
            }
        }
    }
    let mut disk = Disk::default();
    walk(dir, held, false, false, &mut disk);
    disk
}

#[derive(Clone, Copy, Default)]
struct Disk {
    all: u64,
    held: u64,
    consumer: u64,
}

/// The Go runtime's figures from the server's profiler (`/debug/pprof/heap?debug=1`), and the
/// live heap by allocation site (sampled, so estimates), after a collection when `collect`.
#[derive(Clone, Default)]
struct Heap {
    stats: BTreeMap<String, u64>,
    sites: Vec<(String, u64)>,
}

impl Heap {
    fn read(profiler: u16, collect: bool) -> Heap {
        let url = format!("http://127.0.0.1:{profiler}/debug/pprof/heap?debug=1{}", if collect { "&gc=1" } else { "" });
        let Ok(mut answer) = ureq::get(&url).call() else { return Heap::default() };
        let text = answer.body_mut().with_config().limit(256 * 1024 * 1024).read_to_string().unwrap_or_default();
        let mut heap = Heap::default();
        let mut sites: BTreeMap<String, u64> = BTreeMap::new();
        let mut record: Option<(u64, Vec<String>)> = None;
        let mut rate = 512.0 * 1024.0;
        let mut flush = |record: &mut Option<(u64, Vec<String>)>| {
            if let Some((bytes, frames)) = record.take()
                && bytes > 0
            {
                *sites.entry(site_of(&frames)).or_default() += bytes;
            }
        };
        for line in text.lines() {
            if let Some(frame) = line.strip_prefix("#\t0x") {
                if let Some((_, record)) = record.as_mut() {
                    let function = frame.split('\t').nth(1).unwrap_or("?");
                    record.push(function.split("+0x").next().unwrap_or(function).to_string());
                }
            } else if let Some(stat) = line.strip_prefix("# ") {
                flush(&mut record);
                if let Some((name, value)) = stat.split_once(" = ")
                    && let Ok(value) = value.split_whitespace().next().unwrap_or("").parse()
                {
                    heap.stats.insert(name.to_string(), value);
                }
            } else if let Some(header) = line.strip_prefix("heap profile: ") {
                // `heap/N`: N is twice the sampling rate.
                rate = header.rsplit('/').next().and_then(|n| n.trim().parse::<f64>().ok()).map_or(rate, |n| n / 2.0);
            } else if line.contains(" @ ") {
                flush(&mut record);
                // `objects: bytes [allocated objects: bytes] @ stack`, in use, sampled: scaled up as pprof does.
                let mut numbers = line.split_whitespace().take(2).map(|n| n.trim_end_matches(':').parse::<f64>().unwrap_or(0.0));
                let (objects, bytes) = (numbers.next().unwrap_or(0.0), numbers.next().unwrap_or(0.0));
                let scaled = if objects > 0.0 { bytes / (1.0 - (-(bytes / objects) / rate).exp()) } else { 0.0 };
                record = Some((scaled as u64, Vec::new()));
            }
        }
        flush(&mut record);
        heap.sites = sites.into_iter().collect();
        heap.sites.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
        heap
    }

    fn stat(&self, name: &str) -> u64 {
        self.stats.get(name).copied().unwrap_or(0)
    }
}

/// An allocation site named by the server's function that allocated, with the runtime's frame it went through.
fn site_of(frames: &[String]) -> String {
    let short = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
    let Some(ours) = frames.iter().position(|f| f.contains("nats-server")) else { return frames.first().map_or("?".into(), |f| short(f)) };
    if ours == 0 { short(&frames[0]) } else { format!("{} via {}", short(&frames[ours]), short(&frames[0])) }
}

/// What the server and this process hold at one moment.
#[derive(Clone)]
struct Reading {
    /// Messages published to the ingress so far, and waiting (the held consumer's ack-pending).
    published: u64,
    waiting: u64,
    ingress_backlog: u64,
    held_messages: u64,
    held_bytes: u64,
    server_rss: u64,
    heap: Heap,
    disk: Disk,
    host_rss: u64,
    server_cpu: f64,
    /// A consumer info request's round trip.
    info_ms: f64,
}

/// The server's streams and consumers through raw JetStream API requests (async-nats cannot read 2.9's account info).
struct Bench {
    server: PrivateServer,
    client: async_nats::Client,
    js: jetstream::Context,
    held: String,
    ingress_stream: String,
    ingress_subject: String,
    destination: String,
    sampled_stream: String,
    sampled_subject: String,
    published: u64,
    /// CPU profiles being taken (`BENCH_CPU_PROFILE`).
    profiles: Vec<tokio::task::JoinHandle<()>>,
}

impl Bench {
    async fn api(&self, subject: String) -> serde_json::Value {
        let answer = self.client.request(subject.clone(), "".into()).await.unwrap_or_else(|e| panic!("{subject}: {e}"));
        serde_json::from_slice(&answer.payload).unwrap_or_else(|e| panic!("{subject}: {e}"))
    }

    /// The held consumer's ack-pending, and how long asking took.
    async fn waiting(&self) -> (u64, f64) {
        let start = Instant::now();
        let info = self.api(format!("$JS.API.CONSUMER.INFO.{}.{}", self.held, hourglass::broker::nats::hold::CONSUMER)).await;
        (info["num_ack_pending"].as_u64().unwrap_or(0), start.elapsed().as_secs_f64() * 1e3)
    }

    async fn stream_state(&self, name: &str) -> (u64, u64) {
        let info = self.api(format!("$JS.API.STREAM.INFO.{name}")).await;
        (info["state"]["messages"].as_u64().unwrap_or(0), info["state"]["bytes"].as_u64().unwrap_or(0))
    }

    async fn read(&self, collect: bool) -> Reading {
        let (waiting, info_ms) = self.waiting().await;
        let (held_messages, held_bytes) = self.stream_state(&self.held).await;
        let (ingress_backlog, _) = self.stream_state(&self.ingress_stream).await;
        let pid = self.server.pid().to_string();
        // Before the heap is read: a collection (`collect`) would lower it.
        let server_rss = status_bytes(&pid, "VmRSS:");
        let profiler = self.server.profiler;
        let heap = tokio::task::spawn_blocking(move || Heap::read(profiler, collect)).await.unwrap();
        Reading {
            published: self.published,
            waiting,
            ingress_backlog,
            held_messages,
            held_bytes,
            server_rss,
            heap,
            disk: disk_usage(&self.server.store, &self.held),
            host_rss: status_bytes("self", "VmRSS:"),
            server_cpu: cpu_seconds(&pid),
            info_ms,
        }
    }

    /// Publishes to the ingress until `target` are published, `WINDOW` acknowledgements outstanding.
    async fn publish_to(&mut self, target: u64) {
        let mut acks = VecDeque::with_capacity(WINDOW);
        while self.published < target {
            if acks.len() == WINDOW {
                let ack: jetstream::context::PublishAckFuture = acks.pop_front().unwrap();
                ack.await.expect("the ingress stream's acknowledgement");
            }
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("hourglass-destination", self.destination.as_str());
            headers.insert("hourglass-delay", DELAY);
            acks.push_back(self.js.publish_with_headers(self.ingress_subject.clone(), headers, BODY.to_vec().into()).await.expect("publish"));
            self.published += 1;
        }
        for ack in acks {
            ack.await.expect("the ingress stream's acknowledgement");
        }
    }

    /// Until `at_least` wait on the held consumer (or `limit` passes): the count then.
    async fn wait_for(&self, at_least: u64, limit: Duration) -> u64 {
        let start = Instant::now();
        loop {
            let (waiting, _) = self.waiting().await;
            if waiting >= at_least || start.elapsed() > limit {
                return waiting;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The server's RSS read every `SETTLE_EVERY` until settled, starting `not_before`; then a full
    /// reading (the heap after a collection), the server's CPU per second while it settled, and its
    /// RSS `AFTER_COLLECTION` later.
    async fn settle(&self, label: &str, not_before: Instant) -> Point {
        let pid = self.server.pid().to_string();
        if let Some(left) = not_before.checked_duration_since(Instant::now()) {
            println!("  {label}: waiting {:.0} s for the duplicate window to pass over the last publish", left.as_secs_f64());
            tokio::time::sleep(left).await;
        }
        let (start, cpu_start) = (Instant::now(), cpu_seconds(&pid));
        let mut recent: Vec<u64> = Vec::new();
        let settled = loop {
            recent.push(status_bytes(&pid, "VmRSS:"));
            let window = &recent[recent.len().saturating_sub(SETTLE_WINDOW)..];
            let (low, high) = (*window.iter().min().unwrap(), *window.iter().max().unwrap());
            if recent.len() % 6 == 1 {
                println!(
                    "  {label}: {:>4.0} s, server RSS {:.1} MiB (last minute {:.1}–{:.1})",
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
        let cpu = (cpu_seconds(&pid) - cpu_start) / start.elapsed().as_secs_f64();
        let reading = self.read(true).await;
        println!(
            "  {label}: settled {} after {:.0} s; server CPU meanwhile {:.1} % of a core",
            if settled { "yes" } else { "NO" },
            start.elapsed().as_secs_f64(),
            cpu * 100.0
        );
        tokio::time::sleep(AFTER_COLLECTION).await;
        let after_collection = status_bytes(&pid, "VmRSS:");
        println!("  {label}: server RSS {:.1} MiB {} s after a collection", after_collection as f64 / MIB, AFTER_COLLECTION.as_secs());
        Point { label: label.to_string(), reading, cpu, settled, after_collection, lateness: Vec::new() }
    }

    /// With `BENCH_CPU_PROFILE=<dir>`: the server's CPU profile over the next `seconds`, written
    /// in the background to `<dir>/<version>-<label>.pb.gz` (pprof's format).
    fn profile_cpu(&mut self, label: &str, seconds: u64) -> bool {
        let Ok(dir) = std::env::var("BENCH_CPU_PROFILE") else { return false };
        let version = std::env::var("HOURGLASS_TEST_NATS").unwrap_or_else(|_| "2.9".to_string());
        let path = Path::new(&dir).join(format!("{version}-{}.pb.gz", label.replace(' ', "-")));
        let url = format!("http://127.0.0.1:{}/debug/pprof/profile?seconds={seconds}", self.server.profiler);
        let profiling = tokio::task::spawn_blocking(move || {
            let profile = ureq::get(&url).call().ok().and_then(|mut answer| answer.body_mut().with_config().limit(256 * 1024 * 1024).read_to_vec().ok());
            match profile.map(|bytes| std::fs::write(&path, bytes)) {
                Some(Ok(())) => println!("  CPU profile written to {}", path.display()),
                _ => println!("  no CPU profile for {}", path.display()),
            }
        });
        self.profiles.push(profiling);
        true
    }

    /// `SAMPLES` messages of 3–8 s delays through the ingress, one every `SAMPLE_EVERY`: their lateness from the send, sorted.
    async fn sample(&mut self) -> Vec<i64> {
        let consumer = self
            .js
            .get_stream(&self.sampled_stream)
            .await
            .unwrap()
            .create_consumer(pull::Config { ack_policy: AckPolicy::None, deliver_policy: DeliverPolicy::New, ..Default::default() })
            .await
            .expect("sampled consumer");
        let mut messages = consumer.messages().await.unwrap();
        let collecting = tokio::spawn(async move {
            let mut late = Vec::new();
            while (late.len() as u64) < SAMPLES {
                let Ok(next) = tokio::time::timeout(Duration::from_secs(60), messages.next()).await else { break };
                let Some(Ok(message)) = next else { continue };
                let due: u64 = std::str::from_utf8(&message.payload).unwrap().parse().unwrap();
                late.push(now_ms() as i64 - due as i64);
            }
            late.sort_unstable();
            late
        });
        for i in 0..SAMPLES {
            let delay = 3_000 + (i * 997) % 5_000;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("hourglass-destination", self.sampled_subject.as_str());
            headers.insert("hourglass-delay", format!("{delay}ms").as_str());
            let due = now_ms() + delay;
            self.js.publish_with_headers(self.ingress_subject.clone(), headers, due.to_string().into()).await.unwrap().await.expect("sampled publish");
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        collecting.await.unwrap()
    }
}

fn describe_lateness(late: &[i64]) -> String {
    if late.is_empty() {
        return format!("0 of {SAMPLES} arrived");
    }
    format!(
        "{} of {SAMPLES} arrived, {} early; lateness p50 {} ms, p99 {} ms, max {} ms",
        late.len(),
        late.iter().filter(|&&l| l < 0).count(),
        percentile(late, 0.5),
        percentile(late, 0.99),
        late[late.len() - 1]
    )
}

fn progress_header() {
    println!(
        "| published | waiting (ack-pending) | ingress backlog | server RSS MiB | Go heap in use MiB | store on disk MiB | held stream MiB (state.bytes) | host RSS MiB | s | msg/s since last | server CPU since last |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
}

fn progress_row(r: &Reading, seconds: f64, rate: f64, cpu: f64) {
    println!(
        "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {seconds:.0} | {rate:.0} | {:.0} % |",
        r.published,
        r.waiting,
        r.ingress_backlog,
        r.server_rss as f64 / MIB,
        r.heap.stat("HeapInuse") as f64 / MIB,
        r.disk.all as f64 / MIB,
        r.held_bytes as f64 / MIB,
        r.host_rss as f64 / MIB,
        cpu * 100.0
    );
}

/// A settled point: its reading, the server's CPU while it settled, whether it did, and the sample's lateness.
struct Point {
    label: String,
    reading: Reading,
    cpu: f64,
    settled: bool,
    /// The server's RSS `AFTER_COLLECTION` after the reading's collection.
    after_collection: u64,
    lateness: Vec<i64>,
}

async fn measure(bench: &mut Bench, messages: u64, load_limit: Duration) -> Vec<Point> {
    let mut points = Vec::new();
    let mut before = bench.settle("before loading", Instant::now()).await;
    before.lateness = bench.sample().await;
    println!("before loading: server RSS {:.1} MiB; sampled: {}", before.reading.server_rss as f64 / MIB, describe_lateness(&before.lateness));
    points.push(before);

    let checkpoints: Vec<u64> = if messages > CHUNK { vec![CHUNK, messages] } else { vec![messages] };
    // The server's RSS every 250 ms while loading, for its peak.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = tokio::spawn({
        let (peak, pid) = (peak.clone(), bench.server.pid().to_string());
        async move {
            loop {
                peak.fetch_max(status_bytes(&pid, "VmRSS:"), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    let start = Instant::now();
    progress_header();
    let (mut last_time, mut last_waiting, mut last_cpu) = (Instant::now(), 0_u64, cpu_seconds(&bench.server.pid().to_string()));
    let mut stopped_early = false;
    for checkpoint in checkpoints {
        while bench.published < checkpoint && !stopped_early {
            // The host at most a chunk behind: what waits is then what was loaded, not a backlog.
            bench.wait_for(bench.published.saturating_sub(CHUNK), Duration::from_secs(600)).await;
            if bench.published + CHUNK >= messages {
                bench.profile_cpu("last chunk", 20);
            }
            bench.publish_to((bench.published + CHUNK).min(checkpoint)).await;
            let reading = bench.read(false).await;
            let seconds = last_time.elapsed().as_secs_f64();
            let (rate, cpu) = (reading.waiting.saturating_sub(last_waiting) as f64 / seconds, (reading.server_cpu - last_cpu) / seconds);
            (last_time, last_waiting, last_cpu) = (Instant::now(), reading.waiting, reading.server_cpu);
            progress_row(&reading, start.elapsed().as_secs_f64(), rate, cpu);
            if start.elapsed() > load_limit && bench.published < messages {
                println!("loading passed BENCH_LOAD_LIMIT ({} s): stopping at {} published", load_limit.as_secs(), bench.published);
                stopped_early = true;
            }
        }
        let published = bench.published;
        if points.iter().any(|p| p.reading.published == published) {
            continue;
        }
        let waiting = bench.wait_for(published, Duration::from_secs(900)).await;
        let last_publish = Instant::now();
        println!(
            "{published} published, {waiting} waiting after {:.0} s ({:.0} msg/s from the first publish); load average {}",
            start.elapsed().as_secs_f64(),
            waiting as f64 / start.elapsed().as_secs_f64(),
            load_average()
        );
        if bench.published >= messages || stopped_early {
            sampler.abort();
            println!("the server's RSS peaked at {:.1} MiB while loading (read every 250 ms)", peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / MIB);
        }
        let label = format!("{waiting} waiting");
        let mut point = bench.settle(&label, last_publish + DUPLICATE_WINDOW).await;
        if bench.profile_cpu(&format!("{waiting} idle"), 15) {
            tokio::time::sleep(Duration::from_secs(16)).await;
            bench.profile_cpu(&format!("{waiting} sampled"), 18);
        }
        point.lateness = bench.sample().await;
        println!("{label}: sampled: {}", describe_lateness(&point.lateness));
        points.push(point);
        if stopped_early {
            break;
        }
    }
    for profiling in std::mem::take(&mut bench.profiles) {
        profiling.await.ok();
    }
    points
}

fn report(points: &[Point], version: &str) {
    let before = &points[0].reading;
    println!("\nnats-server {version}; load average {}", load_average());
    println!("\n| | {} |", points.iter().map(|p| p.label.as_str()).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(points.len()));
    let row = |name: &str, cell: &dyn Fn(&Point) -> String| println!("| {name} | {} |", points.iter().map(cell).collect::<Vec<_>>().join(" | "));
    let per = |now: u64, then: u64, p: &Point| {
        let waiting = p.reading.waiting;
        if waiting == 0 { "—".to_string() } else { format!("{:.0} B", (now as f64 - then as f64) / waiting as f64) }
    };
    row("waiting (ack-pending)", &|p| p.reading.waiting.to_string());
    row("server RSS, settled", &|p| format!("{:.1} MiB{}", p.reading.server_rss as f64 / MIB, if p.settled { "" } else { " (not settled)" }));
    row("  per waiting message", &|p| per(p.reading.server_rss, before.server_rss, p));
    row(&format!("server RSS {} s after a collection", AFTER_COLLECTION.as_secs()), &|p| format!("{:.1} MiB", p.after_collection as f64 / MIB));
    row("  per waiting message", &|p| per(p.after_collection, points[0].after_collection, p));
    row("Go heap live after a collection (HeapAlloc)", &|p| format!("{:.1} MiB", p.reading.heap.stat("HeapAlloc") as f64 / MIB));
    row("  per waiting message", &|p| per(p.reading.heap.stat("HeapAlloc"), before.heap.stat("HeapAlloc"), p));
    row("Go runtime's memory from the OS (Sys) / returned (HeapReleased)", &|p| {
        format!("{:.1} / {:.1} MiB", p.reading.heap.stat("Sys") as f64 / MIB, p.reading.heap.stat("HeapReleased") as f64 / MIB)
    });
    row("store on disk (du)", &|p| format!("{:.1} MiB", p.reading.disk.all as f64 / MIB));
    row("  per waiting message", &|p| per(p.reading.disk.all, before.disk.all, p));
    row("  of it the held stream's directory", &|p| format!("{:.1} MiB", p.reading.disk.held as f64 / MIB));
    row("  of that its consumer's state (obs/)", &|p| format!("{:.2} MiB ({})", p.reading.disk.consumer as f64 / MIB, per(p.reading.disk.consumer, 0, p)));
    row("held stream, state.bytes", &|p| format!("{:.1} MiB ({})", p.reading.held_bytes as f64 / MIB, per(p.reading.held_bytes, 0, p)));
    row("held stream, messages", &|p| p.reading.held_messages.to_string());
    row("server CPU while settling", &|p| format!("{:.1} % of a core", p.cpu * 100.0));
    row("consumer info round trip", &|p| format!("{:.1} ms", p.reading.info_ms));
    row("host RSS (this process: host and bench client)", &|p| format!("{:.1} MiB", p.reading.host_rss as f64 / MIB));
    row("100 sampled, 3–8 s: p50 / p99 / max late", &|p| {
        let l = &p.lateness;
        if l.is_empty() {
            "none arrived".into()
        } else {
            format!("{} / {} / {} ms ({} arrived)", percentile(l, 0.5), percentile(l, 0.99), l[l.len() - 1], l.len())
        }
    });
    let last = &points[points.len() - 1];
    println!("\nlive heap by allocation site, {} against before loading (sampled by the Go profiler: estimates):", last.label);
    let before_sites: BTreeMap<&str, u64> = before.heap.sites.iter().map(|(s, b)| (s.as_str(), *b)).collect();
    for (site, bytes) in last.reading.heap.sites.iter().take(12) {
        let grown = *bytes as f64 - before_sites.get(site.as_str()).copied().unwrap_or(0) as f64;
        println!("  {:>8.1} MiB ({:+.0} B per waiting message)  {site}", *bytes as f64 / MIB, grown / last.reading.waiting.max(1) as f64);
    }
}

#[tokio::main]
async fn main() {
    let messages: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .or_else(|| std::env::var("BENCH_PENDING").ok().map(|v| v.parse().expect("BENCH_PENDING: a number")))
        .unwrap_or(1_000_000);
    let load_limit = Duration::from_secs(std::env::var("BENCH_LOAD_LIMIT").ok().map_or(900, |v| v.parse().expect("BENCH_LOAD_LIMIT: seconds")));
    let version = std::env::var("HOURGLASS_TEST_NATS").unwrap_or_else(|_| "2.9".to_string());
    let server = PrivateServer::start().await;
    let client = async_nats::connect(server.url()).await.expect("the private server");
    let js = jetstream::new(client.clone());
    let run = support::run_id();
    let names = |what: &str| (format!("bench-pending-{run}-{what}"), format!("bench.pending.{run}.{what}"));
    let ((held, held_subject), (destination_stream, destination), (sampled_stream, sampled_subject)) = (names("held"), names("dest"), names("sampled"));
    let (ingress_stream, ingress_subject) = (format!("bench-pending-{run}-in"), format!("bench.pending.{run}.in"));
    for (name, subject) in [(&destination_stream, &destination), (&sampled_stream, &sampled_subject)] {
        js.create_stream(stream::Config { name: name.clone(), subjects: vec![subject.clone()], ..Default::default() }).await.expect("create stream");
    }
    let text = format!(
        "[broker]\nkind = \"nats\"\nurl = \"{}\"\n[strategies.hold]\nplanner = \"nats-hold\"\nstream = \"{held}\"\nsubject = \"{held_subject}\"\n\
         [service.ingress]\nqueue = \"{ingress_subject}\"\ninvalid_queue = \"{ingress_subject}.invalid\"\n[service.canary]\nenabled = false\n",
        server.url()
    );
    let served = Served::start(Config::parse(Path::new("bench-nats-pending.toml"), text).unwrap()).await;
    println!(
        "{messages} messages to wait (100-byte bodies, delay {DELAY}, nats-hold's max_wait 1 h) through the ingress of `serve` in this process; \
         nats-server {version} of the bench's own (pid {}, {}); load average {}",
        server.pid(),
        server.url(),
        load_average()
    );
    let mut bench = Bench {
        server,
        client,
        js: js.clone(),
        held: held.clone(),
        ingress_stream: ingress_stream.clone(),
        ingress_subject: ingress_subject.clone(),
        destination: destination.clone(),
        sampled_stream: sampled_stream.clone(),
        sampled_subject,
        published: 0,
        profiles: Vec::new(),
    };
    let outcome = {
        let measuring = measure(&mut bench, messages, load_limit);
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        tokio::select! {
            outcome = AssertUnwindSafe(measuring).catch_unwind() => outcome.map_err(Some),
            _ = tokio::signal::ctrl_c() => Err(None),
            _ = terminate.recv() => Err(None),
        }
    };
    if let Ok(points) = &outcome {
        report(points, &version);
    }
    served.stop().await;
    let deleting = Instant::now();
    for name in [held.clone(), format!("{held}-parked"), ingress_stream.clone(), format!("{ingress_stream}-invalid"), destination_stream, sampled_stream] {
        js.delete_stream(&name).await.ok();
    }
    println!("streams deleted in {:.1} s", deleting.elapsed().as_secs_f64());
    drop(bench);
    match outcome {
        Ok(_) => {}
        Err(Some(panic)) => std::panic::resume_unwind(panic),
        Err(None) => {
            eprintln!("interrupted; the server stopped and its store removed");
            std::process::exit(130);
        }
    }
}
