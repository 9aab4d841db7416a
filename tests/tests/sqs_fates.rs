//! Cancel on SQS at the fates queue (see `host/src/broker/sqs/fates.rs`),
//! against the local SQS server: first what the design relies on from a FIFO
//! queue, then cancels and claims in both orders, with the host that
//! answered a cancel gone before the claim comes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use hourglass::broker::sqs::SqsExecutor;
use hourglass::broker::sqs::fates::Entry;
use hourglass::broker::sqs::fates_queue::{FatesQueue, NoReplan, Processed, Reply};
use hourglass::clock::Clock;
use hourglass::headers::TARGET_HEADER;
use hourglass_e2e::sqs::*;

const REMEMBER_MS: u64 = 600_000;

async fn executor() -> Arc<SqsExecutor> {
    let config = sqs_config("planner = \"sqs-cycles\"\ncycle = \"2s\"");
    sqs_scheduler(&config).await.1
}

/// A queue deleted when the test ends, however it ends.
struct Cleanup(Arc<SqsExecutor>, Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (executor, queues) = (self.0.clone(), std::mem::take(&mut self.1));
        // Runs on its own thread: the test's runtime may be shutting down.
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                for queue in queues {
                    if let Ok(Some(url)) = executor.url(&queue).await {
                        executor.client().delete_queue().queue_url(url).send().await.ok();
                    }
                }
            })
        })
        .join()
        .ok();
    }
}

async fn fifo(executor: &SqsExecutor, stem: &str) -> (String, String) {
    let name = format!("{}.fifo", unique_queue(stem));
    let url =
        create_queue(executor, &name, &[("FifoQueue", "true"), ("DeduplicationScope", "messageGroup"), ("FifoThroughputLimit", "perMessageGroupId")]).await;
    (name, url)
}

async fn receive(executor: &SqsExecutor, url: &str, max: i32) -> Vec<Message> {
    let output = executor
        .client()
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(max)
        .visibility_timeout(60)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap();
    output.messages.unwrap_or_default()
}

fn bodies(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| m.body().unwrap_or_default()).collect()
}

async fn reveal(executor: &SqsExecutor, url: &str, messages: &[&Message]) {
    for message in messages {
        executor
            .client()
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(message.receipt_handle().unwrap())
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }
}

/// What the design needs from a FIFO queue, checked on the server the tests
/// run against: a group's messages come oldest first from its head; none
/// comes while one of them is in flight; a receive returns the head together
/// with what follows it; a deleted head gives the head to the next one; a
/// send with a deduplication id already used is absorbed.
#[tokio::test]
async fn a_fifo_group_is_handed_out_from_its_head_and_blocked_while_one_of_it_is_in_flight() {
    let executor = executor().await;
    let (name, url) = fifo(&executor, "fifo-head").await;
    let _cleanup = Cleanup(executor.clone(), vec![name]);
    let send = |group: &'static str, body: &'static str| {
        let (executor, url) = (executor.clone(), url.clone());
        async move {
            executor.client().send_message().queue_url(url).message_group_id(group).message_deduplication_id(body).message_body(body).send().await.unwrap();
        }
    };
    for (group, body) in [("m", "a"), ("m", "b"), ("other", "x"), ("m", "c")] {
        send(group, body).await;
    }
    let all = receive(&executor, &url, 10).await;
    let of_m: Vec<&str> =
        all.iter().filter(|m| m.attributes().unwrap()[&MessageSystemAttributeName::MessageGroupId] == "m").map(|m| m.body().unwrap()).collect();
    assert_eq!(of_m, ["a", "b", "c"], "a group's messages together, oldest first");
    let head = all.iter().find(|m| m.body() == Some("a")).unwrap();
    reveal(&executor, &url, &[head]).await;
    assert!(receive(&executor, &url, 10).await.is_empty(), "the head visible again, but b and c in flight: nothing of the group is handed out");
    reveal(&executor, &url, &all.iter().filter(|m| m.body() != Some("a")).collect::<Vec<_>>()).await;
    let one = receive(&executor, &url, 1).await;
    assert_eq!(bodies(&one), ["a"], "the head comes first");
    let rest = receive(&executor, &url, 10).await;
    assert_eq!(bodies(&rest), ["x"], "while the head is in flight the rest of its group waits");
    executor.client().delete_message().queue_url(&url).receipt_handle(one[0].receipt_handle().unwrap()).send().await.unwrap();
    send("m", "c").await; // the same deduplication id as c: absorbed
    let after = receive(&executor, &url, 10).await;
    assert_eq!(bodies(&after), ["b", "c"], "the deleted head gives way to the next, and the repeated send was absorbed");
}

struct Setup {
    executor: Arc<SqsExecutor>,
    fates: String,
    destination: String,
    replies: String,
    _cleanup: Cleanup,
}

async fn setup(stem: &str) -> Setup {
    let executor = executor().await;
    let fates = format!("{}.fifo", unique_queue(&format!("{stem}-fates")));
    let destination = unique_queue(&format!("{stem}-to"));
    let replies = unique_queue(&format!("{stem}-re"));
    create_queue(&executor, &destination, &[]).await;
    create_queue(&executor, &replies, &[]).await;
    let cleanup = Cleanup(executor.clone(), vec![fates.clone(), destination.clone(), replies.clone()]);
    Setup { executor, fates, destination, replies, _cleanup: cleanup }
}

impl Setup {
    /// A host's view of the fates queue: a new one plays a host started afresh.
    async fn host(&self) -> FatesQueue {
        FatesQueue::open(self.executor.clone(), &self.fates, REMEMBER_MS, Clock::system(), true).await.unwrap()
    }

    async fn claim(&self, host: &FatesQueue, id: &str, body: &str) {
        self.claim_to(host, id, body, &self.destination).await;
    }

    async fn claim_to(&self, host: &FatesQueue, id: &str, body: &str, destination: &str) {
        let target = MessageAttributeValue::builder().data_type("String").string_value(destination).build().unwrap();
        host.claim(id, &format!("claim-{id}"), None, body, &HashMap::from([(TARGET_HEADER.to_string(), target)])).await.unwrap();
    }

    async fn cancel(&self, host: &FatesQueue, id: &str, token: &str) {
        host.append(id, &Entry::Cancel { token: token.into(), reply: Some(self.replies.clone()) }, token).await.unwrap();
    }

    /// Runs `host` until `done` says so of the totals, or fails at the deadline.
    async fn process_until(&self, host: &FatesQueue, deadline: Duration, done: impl Fn(&Processed) -> bool) -> Processed {
        let until = Instant::now() + deadline;
        let mut total = Processed::default();
        while !done(&total) {
            assert!(Instant::now() < until, "not done within {deadline:?}: {total:?}");
            let once = host.process_once(1, &NoReplan).await.unwrap();
            total.received += once.received;
            total.forwarded += once.forwarded;
            total.dropped += once.dropped;
            total.answered += once.answered;
            total.unsettled += once.unsettled;
        }
        total
    }

    /// The answers sent to the reply queue, by token.
    async fn replies(&self) -> HashMap<String, String> {
        take_messages(&self.executor, &self.replies)
            .await
            .iter()
            .map(|m| serde_json::from_str::<Reply>(m.body().unwrap()).unwrap())
            .map(|r| (r.token, r.answer))
            .collect()
    }

    async fn arrived(&self) -> Vec<String> {
        take_messages(&self.executor, &self.destination).await.iter().map(|m| m.body().unwrap_or_default().to_string()).collect()
    }
}

/// A TCP proxy to the local SQS server that holds each connection `delay`
/// before passing it on. The server closes every connection after its answer,
/// so each request takes at least `delay`, as against a distant SQS.
async fn slow_endpoint(delay: Duration) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let upstream = endpoint().trim_start_matches("http://").trim_end_matches('/').to_string();
    let proxy = tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (format!("http://{address}"), proxy)
}

/// The groups a receive brings are carried out side by side, each in its own
/// order. With every request taking a second, ten claims are forwarded, fenced
/// and made visible again in about the four requests each needs in turn (4.1 s
/// measured); one group after another took at least 31 (the receive, then
/// three for each group), and a claim that came meanwhile waited for them all.
/// Half of that is the bound: the rest is room for a slow local server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_of_a_receive_are_carried_out_side_by_side() {
    const LATENCY: Duration = Duration::from_secs(1);
    let s = setup("side").await;
    let direct = s.host().await;
    for n in 0..10 {
        s.claim(&direct, &uuid::Uuid::new_v4().to_string(), &format!("side-{n}")).await;
    }
    let (url, proxy) = slow_endpoint(LATENCY).await;
    let slow = Arc::new(SqsExecutor::connect(None, Some(&url), Duration::from_millis(2)).await.unwrap());
    let host = FatesQueue::open(slow.clone(), &s.fates, REMEMBER_MS, Clock::system(), false).await.unwrap();
    // A running host has looked its destinations up already.
    slow.url(&s.destination).await.unwrap().expect("the destination exists");

    let started = Instant::now();
    let done = host.process_once(1, &NoReplan).await.unwrap();
    let took = started.elapsed();
    proxy.abort();
    eprintln!("ten groups carried out in {took:?} with {LATENCY:?} a request");
    assert_eq!((done.received, done.forwarded, done.unsettled), (10, 10, 0), "{done:?}");
    assert!(took < LATENCY * 16, "took {took:?}; one group after another is 31 requests of {LATENCY:?}");
    assert_eq!(s.arrived().await.len(), 10);
}

/// A claim whose destination is gone cannot be settled; the receive that
/// brought it still succeeds (so the task does not read as down), and the
/// claims beside it arrive.
#[tokio::test]
async fn a_claim_whose_destination_is_gone_does_not_fail_the_receive_or_hold_up_the_others() {
    let s = setup("gone").await;
    let host = s.host().await;
    let gone = unique_queue("never-created");
    s.claim_to(&host, &uuid::Uuid::new_v4().to_string(), "to nowhere", &gone).await;
    for n in 0..3 {
        s.claim(&host, &uuid::Uuid::new_v4().to_string(), &format!("fine-{n}")).await;
    }
    // Every receive is Ok (process_until unwraps it) while the gone one fails each time.
    let done = s.process_until(&host, Duration::from_secs(20), |p| p.forwarded >= 3 && p.unsettled >= 1).await;
    assert_eq!(done.forwarded, 3, "{done:?}");
    let mut arrived = s.arrived().await;
    arrived.sort();
    assert_eq!(arrived, ["fine-0", "fine-1", "fine-2"]);
}

#[tokio::test]
async fn a_cancel_answered_before_the_claim_drops_the_message_on_another_host_after_the_first_is_gone() {
    let s = setup("cancel-first").await;
    let id = uuid::Uuid::new_v4().to_string();
    let first = s.host().await;
    s.cancel(&first, &id, "t-1").await;
    s.process_until(&first, Duration::from_secs(20), |p| p.answered >= 1).await;
    assert_eq!(s.replies().await.get("t-1").map(String::as_str), Some("cancelled"));
    drop(first); // that host is gone; what it decided is in SQS

    let second = s.host().await;
    s.claim(&second, &id, "must never arrive").await;
    // The cancel at the head is held 5 s after it was first seen, then received with the claim behind it.
    let done = s.process_until(&second, Duration::from_secs(40), |p| p.dropped >= 1).await;
    assert_eq!(done.forwarded, 0, "{done:?}");
    assert!(s.arrived().await.is_empty(), "a cancelled message arrived");

    // Asked again: the tombstone at the head answers.
    s.cancel(&second, &id, "t-2").await;
    s.process_until(&second, Duration::from_secs(40), |p| p.answered >= 1).await;
    assert_eq!(s.replies().await.get("t-2").map(String::as_str), Some("already_cancelled"));
    assert!(s.arrived().await.is_empty());
}

#[tokio::test]
async fn a_cancel_sent_after_the_claim_is_answered_409_and_the_message_arrives_once() {
    let s = setup("claim-first").await;
    let id = uuid::Uuid::new_v4().to_string();
    let host = s.host().await;
    s.claim(&host, &id, "on its way").await;
    s.process_until(&host, Duration::from_secs(20), |p| p.forwarded >= 1).await;
    s.cancel(&host, &id, "late").await;
    let done = s.process_until(&host, Duration::from_secs(40), |p| p.answered >= 1).await;
    assert_eq!(s.replies().await.get("late").map(String::as_str), Some("already_released"));
    assert_eq!(done.forwarded, 0, "the claim was not forwarded again: {done:?}");
    assert_eq!(s.arrived().await, ["on its way"]);
    // An id nobody claimed is answered as the RabbitMQ log answers it: cancelled.
    let unknown = uuid::Uuid::new_v4().to_string();
    s.cancel(&host, &unknown, "unknown").await;
    s.process_until(&host, Duration::from_secs(20), |p| p.answered >= 1).await;
    assert_eq!(s.replies().await.get("unknown").map(String::as_str), Some("cancelled"));
}
