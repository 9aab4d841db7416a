//! Coalesces first sends into `SendMessageBatch` requests, per target queue.
//!
//! One `SendMessage` per scheduled message makes a burst to one destination
//! cost a request per message. Here sends that arrive together (or within a
//! short window, 2 ms by default) leave as one request of up to 10 entries and
//! 256 KiB, so N concurrent sends cost about N/10 requests.
//!
//! Each target queue has a worker task fed through a channel. It keeps a few
//! requests in flight, so one slow request does not hold the queue up, and
//! exits after a while idle, so thousands of destinations do not keep a task
//! each; a send that meets a closing worker starts a new one. Every caller
//! awaits its own entry's outcome: an entry SQS refuses fails its caller only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use aws_sdk_sqs::types::{BatchResultErrorEntry, SendMessageBatchRequestEntry};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::executor::ExecutorError;

/// SQS refuses a message (body plus attributes) above 256 KiB, and a batch above that in all.
pub(crate) const SQS_MAX_MESSAGE_BYTES: usize = 262_144;
/// Entries in one `SendMessageBatch` at the most.
pub(crate) const SQS_MAX_BATCH_ENTRIES: usize = 10;

/// Whether a batch of `entries` entries and `bytes` bytes can take one of `next` bytes.
pub(crate) fn fits_in_batch(entries: usize, bytes: usize, next: usize) -> bool {
    entries < SQS_MAX_BATCH_ENTRIES && bytes + next <= SQS_MAX_MESSAGE_BYTES
}

/// How long a worker waits for more sends after the first, unless configured.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_millis(2);

/// The window `broker.send_batch_window` asks for, or the default.
pub fn window(configured: Option<hourglass_planner_sdk::DurationMs>) -> Duration {
    configured.map_or(DEFAULT_WINDOW, |d| Duration::from_millis(d.ms()))
}
/// Requests one queue's worker has outstanding at once.
const MAX_IN_FLIGHT: usize = 8;
/// A worker with nothing to send for this long exits.
const IDLE_EXIT: Duration = Duration::from_secs(30);
/// Sends queued for one worker; more wait for room (back-pressure on callers).
const QUEUED_SENDS: usize = 1_024;
/// The longest a caller waits for SQS's answer, queueing included, as long as
/// RabbitMQ's publisher confirm may take: an HTTP client is answered 503 before
/// its connection's idle timeout (60 s by default) would cut it off unanswered.
pub(crate) const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// One `SendMessageBatch` request: SQS itself, or a fake in tests.
pub(crate) trait SendBatch: Send + Sync + 'static {
    /// Sends entries, whose ids are unique within the request, to one queue.
    /// Returns the entries SQS did not accept; `Err` when the request itself failed.
    fn send_batch(
        &self,
        queue: &str,
        url: &str,
        entries: Vec<SendMessageBatchRequestEntry>,
    ) -> impl Future<Output = Result<Vec<BatchResultErrorEntry>, ExecutorError>> + Send;
}

/// One caller's entry and where its outcome goes.
struct Job {
    entry: SendMessageBatchRequestEntry,
    size: usize,
    answer: oneshot::Sender<Result<(), ExecutorError>>,
}

/// Each target queue's worker, by queue name.
type Workers = Mutex<HashMap<String, mpsc::Sender<Job>>>;

fn lock(workers: &Workers) -> MutexGuard<'_, HashMap<String, mpsc::Sender<Job>>> {
    // The map stays consistent at every step, so a panic elsewhere leaves it usable.
    workers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) struct Batcher<S> {
    sender: Arc<S>,
    window: Duration,
    workers: Arc<Workers>,
}

impl<S: SendBatch> Batcher<S> {
    /// `window`: how long a batch waits for more sends after its first (zero: only what is already queued).
    pub fn new(sender: S, window: Duration) -> Self {
        Batcher { sender: Arc::new(sender), window, workers: Arc::default() }
    }

    /// Sends one checked entry to `queue` (at `url`) in the next batch; returns
    /// once SQS answered for this entry. Its id is replaced by one unique in its batch.
    pub async fn send(&self, queue: &str, url: &str, entry: SendMessageBatchRequestEntry, size: usize) -> Result<(), ExecutorError> {
        let (answer, answered) = oneshot::channel();
        let mut job = Job { entry, size, answer };
        // A worker that went idle refuses the job once it closed; the next lookup starts a new one.
        while let Err(mpsc::error::SendError(refused)) = self.worker(queue, url).send(job).await {
            job = refused;
        }
        match tokio::time::timeout(SEND_TIMEOUT, answered).await {
            Ok(answer) => {
                answer.unwrap_or_else(|_| Err(ExecutorError::Unavailable(format!("SQS SendMessageBatch to {queue}: the batch stopped before SQS answered"))))
            }
            // The entry may still go out: at least once, as after a lost confirm on RabbitMQ.
            Err(_) => Err(ExecutorError::Unavailable(format!(
                "SQS SendMessageBatch to {queue}: no answer within {} s; the message may still be sent",
                SEND_TIMEOUT.as_secs()
            ))),
        }
    }

    /// The queue's open worker, started if there is none.
    fn worker(&self, queue: &str, url: &str) -> mpsc::Sender<Job> {
        let mut workers = lock(&self.workers);
        if let Some(worker) = workers.get(queue)
            && !worker.is_closed()
        {
            return worker.clone();
        }
        let (sender, jobs) = mpsc::channel(QUEUED_SENDS);
        let worker =
            Worker { sender: self.sender.clone(), window: self.window, queue: queue.to_string(), url: url.to_string(), workers: Arc::downgrade(&self.workers) };
        tokio::spawn(worker.run(jobs));
        workers.insert(queue.to_string(), sender.clone());
        sender
    }

    #[cfg(test)]
    fn worker_count(&self) -> usize {
        lock(&self.workers).len()
    }
}

struct Worker<S> {
    sender: Arc<S>,
    window: Duration,
    queue: String,
    url: String,
    /// Weak: the batcher's map holds this worker's channel, not the other way round.
    workers: Weak<Workers>,
}

impl<S: SendBatch> Worker<S> {
    async fn run(self, mut jobs: mpsc::Receiver<Job>) {
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        // A job that did not fit the last batch starts the next one.
        let mut held_over: Option<Job> = None;
        loop {
            let first = match held_over.take() {
                Some(job) => job,
                None => match tokio::time::timeout(IDLE_EXIT, jobs.recv()).await {
                    Ok(Some(job)) => job,
                    Ok(None) => break,
                    // Idle: refuse new jobs (their senders start a new worker), then send what got in before.
                    Err(_) => {
                        jobs.close();
                        continue;
                    }
                },
            };
            // Waiting here while requests are outstanding lets the next batch fill up.
            let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
            let mut batch = vec![first];
            let mut bytes = batch[0].size;
            let deadline = Instant::now() + self.window;
            while batch.len() < SQS_MAX_BATCH_ENTRIES {
                // Past the deadline `timeout_at` still takes what is already queued.
                let next = if self.window.is_zero() { jobs.try_recv().ok() } else { tokio::time::timeout_at(deadline, jobs.recv()).await.ok().flatten() };
                let Some(next) = next else { break };
                if !fits_in_batch(batch.len(), bytes, next.size) {
                    held_over = Some(next);
                    break;
                }
                bytes += next.size;
                batch.push(next);
            }
            let (sender, queue, url) = (self.sender.clone(), self.queue.clone(), self.url.clone());
            tokio::spawn(async move {
                send_and_answer(&*sender, &queue, &url, batch).await;
                drop(permit);
            });
        }
        self.forget();
    }

    /// Removes this worker from the map unless a newer one took its place.
    fn forget(&self) {
        if let Some(workers) = self.workers.upgrade() {
            let mut workers = lock(&workers);
            if workers.get(&self.queue).is_some_and(mpsc::Sender::is_closed) {
                workers.remove(&self.queue);
            }
        }
    }
}

/// One request for the batch; each job gets its own entry's outcome.
async fn send_and_answer<S: SendBatch>(sender: &S, queue: &str, url: &str, batch: Vec<Job>) {
    let mut answers = Vec::with_capacity(batch.len());
    let mut entries = Vec::with_capacity(batch.len());
    for (index, job) in batch.into_iter().enumerate() {
        let mut entry = job.entry;
        entry.id = index.to_string();
        entries.push(entry);
        answers.push(job.answer);
    }
    let outcome = sender.send_batch(queue, url, entries).await;
    for (index, answer) in answers.into_iter().enumerate() {
        let result = match &outcome {
            Err(err) => Err(err.clone()),
            Ok(failed) => match failed.iter().find(|failure| failure.id() == index.to_string()) {
                Some(failure) => Err(entry_failure(queue, failure)),
                None => Ok(()),
            },
        };
        // A caller that stopped waiting gets nothing; its message went all the same.
        let _ = answer.send(result);
    }
}

/// An entry SQS did not accept: the sender's mistake is refused, SQS's own is "unavailable".
pub(super) fn entry_failure(queue: &str, failure: &BatchResultErrorEntry) -> ExecutorError {
    let reason = format!("{}: {}", failure.code(), failure.message().unwrap_or("no message"));
    if failure.sender_fault() {
        ExecutorError::Refused(format!("SQS refused the message to {queue}: {reason}"))
    } else {
        ExecutorError::Unavailable(format!("SQS SendMessageBatch to {queue}: {reason}"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use futures_util::FutureExt;
    use futures_util::future::join_all;

    use super::*;

    /// Records every request; fails entries by body, or whole requests on demand.
    #[derive(Clone, Default)]
    struct FakeSqs {
        requests: Arc<Mutex<Vec<Vec<SendMessageBatchRequestEntry>>>>,
        /// Body → (code, sender fault) of the failure SQS reports for it.
        refusals: HashMap<String, (String, bool)>,
        fail_requests: bool,
        /// Each request takes this long, and the most outstanding at once is kept.
        latency: Duration,
        outstanding: Arc<Mutex<(usize, usize)>>,
    }

    impl FakeSqs {
        fn sizes(&self) -> Vec<usize> {
            let mut sizes: Vec<usize> = self.requests.lock().unwrap().iter().map(Vec::len).collect();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            sizes
        }

        fn most_outstanding(&self) -> usize {
            self.outstanding.lock().unwrap().1
        }
    }

    impl SendBatch for FakeSqs {
        async fn send_batch(&self, queue: &str, _url: &str, entries: Vec<SendMessageBatchRequestEntry>) -> Result<Vec<BatchResultErrorEntry>, ExecutorError> {
            {
                let mut outstanding = self.outstanding.lock().unwrap();
                outstanding.0 += 1;
                outstanding.1 = outstanding.1.max(outstanding.0);
            }
            tokio::time::sleep(self.latency).await;
            self.outstanding.lock().unwrap().0 -= 1;
            self.requests.lock().unwrap().push(entries.clone());
            if self.fail_requests {
                return Err(ExecutorError::Unavailable(format!("SQS SendMessageBatch to {queue}: connection reset")));
            }
            let failed = entries.iter().filter_map(|entry| {
                let (code, sender_fault) = self.refusals.get(&entry.message_body)?;
                Some(
                    BatchResultErrorEntry::builder()
                        .id(&entry.id)
                        .code(code)
                        .message(format!("{code} for this entry"))
                        .sender_fault(*sender_fault)
                        .build()
                        .unwrap(),
                )
            });
            Ok(failed.collect())
        }
    }

    fn entry(body: &str) -> SendMessageBatchRequestEntry {
        SendMessageBatchRequestEntry::builder().id("caller's").message_body(body).build().unwrap()
    }

    async fn send_all(batcher: &Batcher<FakeSqs>, bodies: &[String], size: usize) -> Vec<Result<(), ExecutorError>> {
        join_all(bodies.iter().map(|body| batcher.send("q", "url-q", entry(body), size))).await
    }

    fn bodies(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("m{i}")).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_sends_go_out_ten_at_a_time_with_unique_ids() {
        let fake = FakeSqs::default();
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        let results = send_all(&batcher, &bodies(25), 100).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(fake.sizes(), [10, 10, 5]);
        let requests = fake.requests.lock().unwrap();
        for request in requests.iter() {
            let ids: HashSet<&str> = request.iter().map(|e| e.id.as_str()).collect();
            assert_eq!(ids.len(), request.len(), "ids unique within a request");
        }
        let sent: HashSet<&str> = requests.iter().flatten().map(|e| e.message_body.as_str()).collect();
        assert_eq!(sent.len(), 25, "every message sent once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_stops_below_256_kib() {
        let fake = FakeSqs::default();
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        // Two fit in 256 KiB, three do not.
        let results = send_all(&batcher, &bodies(5), 100 * 1024).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(fake.sizes(), [2, 2, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_entry_fails_only_its_own_caller() {
        let fake = FakeSqs {
            refusals: [("bad".to_string(), ("InvalidParameterValue".to_string(), true)), ("unlucky".to_string(), ("InternalError".to_string(), false))].into(),
            ..Default::default()
        };
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        let bodies = ["ok-1", "bad", "ok-2", "unlucky", "ok-3"].map(String::from);
        let results = send_all(&batcher, &bodies, 10).await;
        assert_eq!(fake.sizes(), [5], "one request");
        for (body, result) in bodies.iter().zip(&results) {
            match (body.as_str(), result) {
                ("bad", Err(ExecutorError::Refused(text))) => assert!(text.contains("InvalidParameterValue: InvalidParameterValue for this entry"), "{text}"),
                ("unlucky", Err(ExecutorError::Unavailable(text))) => assert!(text.contains("InternalError"), "{text}"),
                (ok, Ok(())) if ok.starts_with("ok") => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_is_answered_unavailable_when_sqs_does_not_answer_in_time() {
        let fake = FakeSqs { latency: SEND_TIMEOUT * 3, ..Default::default() };
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        let started = Instant::now();
        let err = batcher.send("q", "url", entry("slow"), 10).await.unwrap_err();
        assert!(matches!(&err, ExecutorError::Unavailable(m) if m.contains("no answer within 30 s")), "{err}");
        assert_eq!(started.elapsed(), SEND_TIMEOUT, "answered at the deadline, not when SQS answers");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_request_fails_every_entry_in_it() {
        let fake = FakeSqs { fail_requests: true, ..Default::default() };
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        let results = send_all(&batcher, &bodies(3), 10).await;
        for result in results {
            assert!(matches!(&result, Err(ExecutorError::Unavailable(text)) if text.contains("connection reset")), "{result:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_within_the_window_joins_the_batch_and_a_zero_window_does_not_wait() {
        for (window, expected) in [(DEFAULT_WINDOW, vec![2]), (Duration::ZERO, vec![1, 1])] {
            let fake = FakeSqs::default();
            let batcher = Batcher::new(fake.clone(), window);
            let late = async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                batcher.send("q", "url-q", entry("late"), 10).await
            };
            let (first, late) = tokio::join!(batcher.send("q", "url-q", entry("first"), 10), late);
            assert!(first.is_ok() && late.is_ok());
            assert_eq!(fake.sizes(), expected, "window {window:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn several_requests_per_queue_are_in_flight_at_once() {
        let fake = FakeSqs { latency: Duration::from_millis(50), ..Default::default() };
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        let results = send_all(&batcher, &bodies(200), 10).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(fake.sizes(), [10; 20]);
        assert_eq!(fake.most_outstanding(), MAX_IN_FLIGHT, "bounded, and not one at a time");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_worker_exits_and_the_next_send_starts_another() {
        let fake = FakeSqs::default();
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        batcher.send("q", "url-q", entry("before"), 10).await.unwrap();
        assert_eq!(batcher.worker_count(), 1);
        tokio::time::sleep(IDLE_EXIT + Duration::from_secs(1)).await;
        assert_eq!(batcher.worker_count(), 0, "the idle worker exited and left the map");
        batcher.send("q", "url-q", entry("after"), 10).await.unwrap();
        assert_eq!(fake.sizes(), [1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_meeting_a_closed_worker_is_not_lost() {
        let fake = FakeSqs::default();
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        // What a send sees when the worker closed between its lookup and its send.
        let (closed, jobs) = mpsc::channel(1);
        drop(jobs);
        lock(&batcher.workers).insert("q".into(), closed);
        batcher.send("q", "url-q", entry("raced"), 10).await.unwrap();
        assert_eq!(fake.sizes(), [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_stops_waiting_does_not_harm_its_batch() {
        let fake = FakeSqs::default();
        let batcher = Batcher::new(fake.clone(), DEFAULT_WINDOW);
        // Polled once: queued, then dropped before the answer.
        assert!(batcher.send("q", "url-q", entry("abandoned"), 10).now_or_never().is_none());
        batcher.send("q", "url-q", entry("waited"), 10).await.unwrap();
        assert_eq!(fake.sizes(), [2], "both in one request, the abandoned one answered without a panic");
    }
}
