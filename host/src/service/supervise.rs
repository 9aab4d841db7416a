//! Supervised background tasks: the AMQP ingress, redelivery, each SQS pump,
//! the RabbitMQ connection keeper.
//!
//! A task is made by a factory closure, so it can be made again. When it
//! panics, returns an error, or ends while the service is not stopping, the
//! supervisor logs why, counts `hourglass_task_restarts_total{task}`, marks
//! the task down (so `/readyz` names it) and starts it again after a backoff
//! that doubles from 250 ms to at most 30 s; a task that ran a while restarts
//! quickly again.
//!
//! Each task watches the stop signal itself; one that has not ended
//! [`SLOW_STOP`] after it is named in the log, so whatever holds up a
//! shutdown says what it is.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::metrics::Metrics;

const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A task that ran this long before failing starts again at the first backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// A task still running this long after the stop is named as holding up shutdown.
const SLOW_STOP: Duration = Duration::from_secs(2);

/// Whether a running task is doing its job (a consumer attached to its queue, say).
pub(crate) type Probe = Box<dyn Fn() -> bool + Send + Sync>;

/// Why a task is not up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Down {
    pub task: String,
    pub reason: String,
}

struct Task {
    name: String,
    /// `None` while running; why it is down otherwise.
    down: Mutex<Option<String>>,
    probe: Option<Probe>,
}

impl Task {
    fn set_down(&self, reason: Option<String>) {
        *self.down.lock().unwrap_or_else(|p| p.into_inner()) = reason;
    }

    fn state(&self) -> Option<Down> {
        let reason = match self.down.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(reason) => reason,
            None if self.probe.as_ref().is_some_and(|up| !up()) => "running, not attached yet (connecting to the broker)".into(),
            None => return None,
        };
        Some(Down { task: self.name.clone(), reason })
    }
}

/// Why a supervised task stopped: any error, its text shown on `/readyz` as
/// the task's reason (a `String` or `&str` converts with `.into()`).
pub(crate) type TaskError = Box<dyn std::error::Error + Send + Sync>;

/// The supervised tasks of one service.
pub struct Supervisor {
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
    tasks: Mutex<Vec<Arc<Task>>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Supervisor {
    /// Tasks stop (and are not restarted) once `stop` turns true.
    pub fn new(metrics: Arc<Metrics>, stop: watch::Receiver<bool>) -> Supervisor {
        Supervisor { metrics, stop, tasks: Mutex::default(), handles: Mutex::default() }
    }

    /// Runs `make()`'s future under supervision as `name`. `probe`, if given,
    /// says whether the running task is up.
    pub fn spawn<F, Fut>(&self, name: impl Into<String>, probe: Option<Probe>, make: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
    {
        let task = Arc::new(Task { name: name.into(), down: Mutex::new(Some("starting".into())), probe });
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task.clone());
        let handle = tokio::spawn(supervise(task, make, self.metrics.clone(), self.stop.clone()));
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).push(handle);
    }

    /// Whether a task of this name is supervised.
    pub fn has(&self, name: &str) -> bool {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|t| t.name == name)
    }

    /// Every task that is not up, and why.
    pub fn down(&self) -> Vec<Down> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).iter().filter_map(|t| t.state()).collect()
    }

    /// Waits for every supervisor loop to end (after `stop` turned true).
    pub async fn join(&self) {
        let handles = std::mem::take(&mut *self.handles.lock().unwrap_or_else(|p| p.into_inner()));
        for handle in handles {
            let _ = handle.await;
        }
    }
}

async fn supervise<F, Fut>(task: Arc<Task>, mut make: F, metrics: Arc<Metrics>, mut stop: watch::Receiver<bool>)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
{
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
    while !*stop.borrow() {
        let started = Instant::now();
        task.set_down(None);
        // Its own tokio task, so a panic ends only the attempt, not the supervisor.
        let mut attempt = tokio::spawn(make());
        let outcome = tokio::select! {
            outcome = &mut attempt => outcome,
            () = stopped_for(SLOW_STOP, stop.clone()) => {
                tracing::warn!(task = %task.name, waited = ?SLOW_STOP, "background task has not stopped yet; it holds up shutdown");
                attempt.await
            }
        };
        if *stop.borrow() {
            break;
        }
        let reason = match outcome {
            Ok(Ok(())) => "ended while the service was running".to_string(),
            Ok(Err(err)) => err.to_string(),
            Err(join) if join.is_panic() => format!("panicked: {}", panic_text(join.into_panic())),
            Err(join) => format!("cancelled: {join}"),
        };
        if started.elapsed() >= HEALTHY_RUN {
            backoff.reset();
        }
        let wait = backoff.next_wait();
        tracing::error!(task = %task.name, %reason, restart_in = ?wait, "background task down; restarting");
        metrics.task_restarted(&task.name);
        task.set_down(Some(reason));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    task.set_down(Some("stopped".into()));
}

/// Returns `after` the stop was sent; never, if it is not.
async fn stopped_for(after: Duration, mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|stopping| *stopping).await.is_err() {
        // No one is left to send a stop.
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(after).await;
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(|| "(no message)".to_string(), |s| s.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    async fn until(what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_panicking_task_is_down_named_counted_and_restarted() {
        let metrics = Arc::new(Metrics::default());
        let (stop_tx, stop) = watch::channel(false);
        let supervisor = Supervisor::new(metrics.clone(), stop.clone());
        let attempts = Arc::new(AtomicU32::new(0));
        let (release_tx, release) = watch::channel(false);
        let counted = attempts.clone();
        supervisor.spawn("ingress", None, move || {
            let attempt = counted.fetch_add(1, Ordering::SeqCst) + 1;
            let (mut release, mut stop) = (release.clone(), stop.clone());
            async move {
                if attempt == 1 {
                    let _ = release.wait_for(|r| *r).await;
                    panic!("poison message");
                }
                // The second attempt runs until stopped, like a consumer.
                let _ = stop.wait_for(|s| *s).await;
                Ok(())
            }
        });
        until("the task up", || supervisor.down().is_empty()).await;
        release_tx.send(true).unwrap();
        until("the task restarted", || attempts.load(Ordering::SeqCst) == 2).await;
        until("the task up again", || supervisor.down().is_empty()).await;
        let text = metrics.encode();
        assert!(text.contains("hourglass_task_restarts_total{task=\"ingress\"} 1"), "{text}");
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), supervisor.join()).await.expect("supervisor stops");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn while_waiting_to_restart_the_task_is_down_with_its_reason() {
        let metrics = Arc::new(Metrics::default());
        let (_stop_tx, stop) = watch::channel(false);
        let supervisor = Supervisor::new(metrics.clone(), stop);
        // Taken before the first attempt, so both waits fall inside the measured span.
        let started = Instant::now();
        supervisor.spawn("pump:q", None, || async { Err("queue gone".into()) });
        until("the failure seen", || supervisor.down().iter().any(|d| d.reason == "queue gone")).await;
        assert_eq!(supervisor.down(), vec![Down { task: "pump:q".into(), reason: "queue gone".into() }]);
        // Backoff steps of 250 ms, then 500 ms, each wait at least half its step: two more attempts take at least 0.375 s.
        until("two more restarts", || metrics.encode().contains("hourglass_task_restarts_total{task=\"pump:q\"} 3")).await;
        assert!(started.elapsed() >= Duration::from_millis(375), "restarted after {:?}: no backoff", started.elapsed());
    }

    /// Log lines, as the service's own subscriber would write them.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn lines_with(&self, text: &str) -> usize {
            String::from_utf8_lossy(&self.0.lock().unwrap()).lines().filter(|line| line.contains(text)).count()
        }
    }

    // Paused time on one thread: the subscriber (thread-local) sees every task, and seconds pass at once.
    #[tokio::test(start_paused = true)]
    async fn a_task_that_outlives_the_stop_is_named_once_and_still_awaited() {
        let log = Captured::default();
        let writer = log.clone();
        let _logging = tracing::subscriber::set_default(tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish());
        let (stop_tx, stop) = watch::channel(false);
        let supervisor = Supervisor::new(Arc::new(Metrics::default()), stop.clone());
        let (release_tx, release) = watch::channel(false);
        supervisor.spawn("stubborn", None, move || {
            let mut release = release.clone();
            async move {
                let _ = release.wait_for(|r| *r).await;
                Ok(())
            }
        });
        supervisor.spawn("prompt", None, move || {
            let mut stop = stop.clone();
            async move {
                let _ = stop.wait_for(|s| *s).await;
                Ok(())
            }
        });
        until("both running", || supervisor.down().is_empty()).await;
        let stopped_at = tokio::time::Instant::now();
        stop_tx.send(true).unwrap();
        until("the stubborn task named", || log.lines_with("holds up shutdown") > 0).await;
        assert!(stopped_at.elapsed() >= SLOW_STOP, "named after {:?}", stopped_at.elapsed());
        tokio::time::sleep(SLOW_STOP * 5).await;
        assert_eq!(log.lines_with("holds up shutdown"), 1, "named once");
        assert_eq!(log.lines_with("task=stubborn"), 1, "by name");
        assert_eq!(log.lines_with("task=prompt"), 0, "a task that stopped is not named");
        release_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), supervisor.join()).await.expect("the supervisor waits for it, then stops");
    }

    #[tokio::test]
    async fn a_probe_that_says_no_makes_a_running_task_down() {
        let (_stop_tx, stop) = watch::channel(false);
        let supervisor = Supervisor::new(Arc::new(Metrics::default()), stop);
        let attached = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe = attached.clone();
        supervisor.spawn("redelivery", Some(Box::new(move || probe.load(Ordering::SeqCst))), std::future::pending);
        until("the task started", || supervisor.down().iter().all(|d| d.reason != "starting")).await;
        assert_eq!(supervisor.down().len(), 1);
        assert_eq!(supervisor.down()[0].task, "redelivery");
        attached.store(true, Ordering::SeqCst);
        assert!(supervisor.down().is_empty());
    }
}
