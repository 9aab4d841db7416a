//! What the SQS benches share: destinations, a consumer that times arrivals,
//! lateness percentiles, a proxy that counts the requests a client makes by
//! action (what SQS bills), and a plain aws-sdk-sqs pump as the baseline.

// Each bench uses part of this.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry};
use hourglass::clock::unix_now_ms;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

pub fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL_SQS").unwrap_or_else(|_| {
        eprintln!("AWS_ENDPOINT_URL_SQS is not set: run scripts/bench-sqs, which starts a local SQS server (moto) and the SQS benches");
        std::process::exit(2)
    })
}

pub fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// A client of the SQS server at `endpoint`, as the host makes one (test credentials, any region).
pub fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new("test", "test", None, None, "bench"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

pub async fn create_destination(client: &aws_sdk_sqs::Client, name: &str) -> String {
    client.create_queue().queue_name(name).send().await.expect("create the destination");
    name.to_string()
}

pub async fn url_of(client: &aws_sdk_sqs::Client, queue: &str) -> String {
    client.get_queue_url().queue_name(queue).send().await.expect("queue URL").queue_url().unwrap_or_default().to_string()
}

pub async fn delete_queues(client: &aws_sdk_sqs::Client, names: impl IntoIterator<Item = String>) {
    for name in names {
        if let Ok(url) = client.get_queue_url().queue_name(&name).send().await {
            client.delete_queue().queue_url(url.queue_url().unwrap_or_default()).send().await.ok();
        }
    }
}

/// Receives and deletes from `queue`, sending (body, arrival ms) on.
pub fn consume(client: aws_sdk_sqs::Client, queue: String) -> mpsc::UnboundedReceiver<(String, u64)> {
    let (sender, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let url = url_of(&client, &queue).await;
        while !sender.is_closed() {
            let Ok(output) = client
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
            else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let at = unix_now_ms();
            let mut deletes = client.delete_message_batch().queue_url(&url);
            for (i, message) in output.messages().iter().enumerate() {
                sender.send((message.body().unwrap_or_default().to_string(), at)).ok();
                deletes = deletes.entries(
                    DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(message.receipt_handle().unwrap_or_default()).build().unwrap(),
                );
            }
            if !output.messages().is_empty() {
                deletes.send().await.ok();
            }
        }
    });
    received
}

/// Consumers of every queue in `queues`, merged into one stream of arrivals.
pub fn consume_all(client: &aws_sdk_sqs::Client, queues: &[String]) -> mpsc::UnboundedReceiver<(String, u64)> {
    let (merged, all) = mpsc::unbounded_channel();
    for queue in queues {
        let mut arrivals = consume(client.clone(), queue.clone());
        let merged = merged.clone();
        tokio::spawn(async move {
            while let Some(arrival) = arrivals.recv().await {
                if merged.send(arrival).is_err() {
                    return;
                }
            }
        });
    }
    all
}

/// Each expected message's lateness in ms (sorted), until all came or `patience` passed without one.
pub async fn collect(arrivals: &mut mpsc::UnboundedReceiver<(String, u64)>, due: &HashMap<String, u64>, patience: Duration) -> Vec<i64> {
    let mut late = HashMap::new();
    let started = Instant::now();
    while late.len() < due.len() {
        match tokio::time::timeout(patience, arrivals.recv()).await {
            Ok(Some((body, at))) => {
                if let Some(due_at) = due.get(&body) {
                    late.entry(body).or_insert(at as i64 - *due_at as i64);
                }
            }
            _ => break,
        }
    }
    if late.len() < due.len() {
        eprintln!("only {} of {} arrived after {:?}", late.len(), due.len(), started.elapsed());
    }
    let mut late: Vec<i64> = late.into_values().collect();
    late.sort_unstable();
    late
}

pub fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

pub fn summary(late: &[i64]) -> String {
    format!(
        "lateness from due: {} early, p50 {} ms, p99 {} ms, max {} ms",
        late.iter().filter(|l| **l < 0).count(),
        percentile(late, 0.5),
        percentile(late, 0.99),
        late.last().copied().unwrap_or_default()
    )
}

/// Actions that move messages (the rest is set-up: URLs, queue creation, attributes, tags, listing).
pub const MESSAGE_ACTIONS: [&str; 7] =
    ["SendMessage", "SendMessageBatch", "ReceiveMessage", "DeleteMessage", "DeleteMessageBatch", "ChangeMessageVisibility", "ChangeMessageVisibilityBatch"];

/// A TCP proxy in front of the SQS server that counts the requests passing
/// through it by action (the JSON protocol's `X-Amz-Target` header): the
/// count a bill would show, independent of what the client says it did.
pub struct CountingProxy {
    pub endpoint: String,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

pub type Counts = BTreeMap<String, u64>;

impl CountingProxy {
    pub async fn start(upstream: &str) -> CountingProxy {
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let counts: Arc<Mutex<Counts>> = Arc::default();
        let shared = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counts) = (upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else { return };
                    client.set_nodelay(true).ok();
                    server.set_nodelay(true).ok();
                    let (client_read, mut client_write) = client.into_split();
                    let (mut server_read, server_write) = server.into_split();
                    let requests = tokio::spawn(count_requests(client_read, server_write, counts));
                    tokio::io::copy(&mut server_read, &mut client_write).await.ok();
                    requests.abort();
                });
            }
        });
        CountingProxy { endpoint, counts }
    }

    pub fn snapshot(&self) -> Counts {
        self.counts.lock().unwrap().clone()
    }
}

/// Counts since `before`, by action.
pub fn since(now: &Counts, before: &Counts) -> Counts {
    now.iter().map(|(action, n)| (action.clone(), n - before.get(action).copied().unwrap_or(0))).filter(|(_, n)| *n > 0).collect()
}

pub fn message_requests(counts: &Counts) -> u64 {
    counts.iter().filter(|(action, _)| MESSAGE_ACTIONS.contains(&action.as_str())).map(|(_, n)| n).sum()
}

pub fn setup_requests(counts: &Counts) -> u64 {
    counts.iter().filter(|(action, _)| !MESSAGE_ACTIONS.contains(&action.as_str())).map(|(_, n)| n).sum()
}

/// Copies a client's bytes to the server, reading each request's head for
/// its action and skipping its body by `Content-Length`.
async fn count_requests(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, counts: Arc<Mutex<Counts>>) {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut body_left = 0usize;
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
        pending.extend_from_slice(&buffer[..n]);
        loop {
            if body_left > 0 {
                let skipped = body_left.min(pending.len());
                pending.drain(..skipped);
                body_left -= skipped;
                if body_left > 0 {
                    break;
                }
            }
            let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else { break };
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            pending.drain(..end + 4);
            let mut action = "unknown".to_string();
            for line in head.split("\r\n") {
                let Some((name, value)) = line.split_once(':') else { continue };
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => body_left = value.trim().parse().unwrap_or(0),
                    "x-amz-target" => action = value.trim().trim_start_matches("AmazonSQS.").to_string(),
                    _ => {}
                }
            }
            *counts.lock().unwrap().entry(action).or_default() += 1;
        }
    }
}

/// Attributes the raw pump's messages carry: when they are due, and where to.
const RAW_DUE: &str = "raw-due";
const RAW_TO: &str = "raw-to";

fn text(value: impl Into<String>) -> MessageAttributeValue {
    MessageAttributeValue::builder().data_type("String").string_value(value).build().unwrap()
}

/// Creates a FIFO delay queue for the raw pump, its queue-level delay the cycle.
pub async fn create_raw_delay_queue(client: &aws_sdk_sqs::Client, name: &str, cycle: Duration) -> String {
    client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::DelaySeconds, cycle.as_secs().to_string())
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .attributes(QueueAttributeName::DeduplicationScope, "messageGroup")
        .attributes(QueueAttributeName::FifoThroughputLimit, "perMessageGroupId")
        .send()
        .await
        .expect("create the raw delay queue")
        .queue_url()
        .unwrap_or_default()
        .to_string()
}

/// The entry the raw client sends for message `id` (its body too), due at `due_ms`,
/// to `destination` (a URL): into the delay queue, cycle `cycle`.
pub fn raw_cycle_entry(id: &str, body: &str, due_ms: u64, destination: &str, cycle: u32) -> SendMessageBatchRequestEntry {
    SendMessageBatchRequestEntry::builder()
        .id(format!("c{cycle}-{}", id.replace(|c: char| !c.is_ascii_alphanumeric(), "_")))
        .message_body(body)
        .message_group_id(id)
        .message_deduplication_id(format!("{id}-{cycle}"))
        .message_attributes(RAW_DUE, text(due_ms.to_string()))
        .message_attributes(RAW_TO, text(destination))
        .message_attributes("raw-cycle", text(cycle.to_string()))
        .build()
        .unwrap()
}

/// Sends entries to one queue in batches of ten, all batches at once.
pub async fn raw_send(client: &aws_sdk_sqs::Client, url: &str, entries: Vec<SendMessageBatchRequestEntry>) {
    let batches = entries.chunks(10).map(|chunk| {
        let mut entries = chunk.to_vec();
        for (n, entry) in entries.iter_mut().enumerate() {
            entry.id = format!("{n}");
        }
        client.send_message_batch().queue_url(url).set_entries(Some(entries)).send()
    });
    for sent in futures_util::future::join_all(batches).await {
        sent.expect("raw SendMessageBatch");
    }
}

/// What a pump does, written plainly against aws-sdk-sqs: a 20 s long poll
/// for ten, each message sent on (back to the delay queue while more than a
/// cycle remains, else to its destination with the rest as `DelaySeconds`),
/// batches to every target queue at once, then one delete. No bundles, no linger, no
/// planner: the floor a pump is measured against.
pub async fn raw_pump(client: aws_sdk_sqs::Client, delay_queue_url: String, cycle: Duration, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let received = tokio::select! {
            received = client
                .receive_message()
                .queue_url(&delay_queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(20)
                .message_attribute_names("All")
                .send() => received,
            _ = stop.changed() => return,
        };
        let Ok(received) = received else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let now = unix_now_ms();
        let mut onward: BTreeMap<String, Vec<SendMessageBatchRequestEntry>> = BTreeMap::new();
        let mut deletes = Vec::new();
        for (n, message) in received.messages().iter().enumerate() {
            let attribute = |name: &str| message.message_attributes().and_then(|a| a.get(name)).and_then(|v| v.string_value()).unwrap_or_default().to_string();
            let due: u64 = attribute(RAW_DUE).parse().unwrap_or(0);
            let destination = attribute(RAW_TO);
            let cycle_number: u32 = attribute("raw-cycle").parse().unwrap_or(0);
            let body = message.body().unwrap_or_default();
            let remaining = due.saturating_sub(now);
            if remaining > cycle.as_millis() as u64 {
                let entry = raw_cycle_entry(body, body, due, &destination, cycle_number + 1);
                onward.entry(delay_queue_url.clone()).or_default().push(entry);
            } else {
                let entry = SendMessageBatchRequestEntry::builder()
                    .id(n.to_string())
                    .message_body(body)
                    .delay_seconds(remaining.div_ceil(1_000) as i32)
                    .build()
                    .unwrap();
                onward.entry(destination).or_default().push(entry);
            }
            deletes.push(
                DeleteMessageBatchRequestEntry::builder().id(n.to_string()).receipt_handle(message.receipt_handle().unwrap_or_default()).build().unwrap(),
            );
        }
        futures_util::future::join_all(onward.into_iter().map(|(url, entries)| {
            let client = &client;
            async move { raw_send(client, &url, entries).await }
        }))
        .await;
        if !deletes.is_empty() {
            client.delete_message_batch().queue_url(&delay_queue_url).set_entries(Some(deletes)).send().await.ok();
        }
    }
}
